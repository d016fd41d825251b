/**
 * The official openai Node SDK against a gateway session: `node openai_sdk.mjs CASE`.
 *
 * - responses_call: a streamed Responses function call (`client.responses.stream`): its events,
 *   with the arguments the SDK assembled from them, and the SDK's final response;
 * - chat_logprobs: a Chat Completion with `logprobs: true`, plain then streamed, and a streamed
 *   one asking for `top_logprobs` (what the gateway answers);
 * - responses_logprobs: a Responses request with `include: ["message.output_text.logprobs"]`,
 *   plain then streamed.
 */

import { API_KEY, MODEL, OPENAI_BASE_URL, run } from "./compat.mjs";

const { default: OpenAI } = await import("openai");

const client = new OpenAI({ baseURL: OPENAI_BASE_URL, apiKey: API_KEY, maxRetries: 0 });

const weather = {
  type: "function",
  name: "get_weather",
  description: "Current weather of a city",
  parameters: {
    type: "object",
    properties: { city: { type: "string" } },
    required: ["city"],
    additionalProperties: false,
  },
  strict: true,
};

// The fields of a stream event the tests read: which event, and what it says of the call.
function eventSummary(e) {
  const out = { type: e.type };
  if (e.item) out.item = { type: e.item.type, status: e.item.status, arguments: e.item.arguments };
  if (e.type === "response.function_call_arguments.delta") out.delta = e.delta;
  if (e.type === "response.function_call_arguments.done") out.arguments = e.arguments;
  return out;
}

function outputText(response) {
  const message = response.output.find((item) => item.type === "message");
  const part = message?.content.find((c) => c.type === "output_text");
  return { text: part?.text, logprobs: part?.logprobs, createdAt: response.created_at };
}

const question = [{ role: "user", content: "Say hello." }];

await run({
  async responses_call() {
    const stream = client.responses.stream({
      model: MODEL,
      input: "What is the weather in Tokyo?",
      tools: [weather],
    });
    // the SDK's own view of each delta event carries `snapshot`: the arguments it has assembled
    // so far, from the item `output_item.added` announced and each delta since
    const snapshots = [];
    stream.on("response.function_call_arguments.delta", (e) => snapshots.push(e.snapshot));
    const events = [];
    for await (const event of stream) events.push(eventSummary(event));
    const final = await stream.finalResponse();
    return {
      events,
      snapshots,
      status: final.status,
      createdAt: final.created_at,
      calls: final.output
        .filter((item) => item.type === "function_call")
        .map((c) => ({ name: c.name, arguments: c.arguments, status: c.status })),
    };
  },

  async chat_logprobs() {
    const plain = await client.chat.completions.create({
      model: MODEL,
      messages: question,
      logprobs: true,
    });
    const stream = await client.chat.completions.create({
      model: MODEL,
      messages: question,
      logprobs: true,
      stream: true,
    });
    const chunks = [];
    let finishReason = null;
    for await (const chunk of stream) {
      for (const choice of chunk.choices) {
        chunks.push({
          content: choice.delta?.content ?? null,
          logprobs: choice.logprobs?.content ?? null,
        });
        finishReason = choice.finish_reason ?? finishReason;
      }
    }
    let topLogprobs;
    try {
      const refused = await client.chat.completions.create({
        model: MODEL,
        messages: question,
        logprobs: true,
        top_logprobs: 2,
        stream: true,
      });
      for await (const _ of refused);
      topLogprobs = { status: 200 };
    } catch (error) {
      topLogprobs = { status: error.status, message: error.message };
    }
    return {
      plain: {
        content: plain.choices[0].message.content,
        logprobs: plain.choices[0].logprobs?.content,
      },
      streamed: { chunks, finishReason },
      topLogprobs,
    };
  },

  async responses_logprobs() {
    const include = ["message.output_text.logprobs"];
    const plain = await client.responses.create({ model: MODEL, input: "Say hello.", include });
    const stream = client.responses.stream({ model: MODEL, input: "Say hello.", include });
    const deltas = [];
    for await (const event of stream) {
      if (event.type === "response.output_text.delta") {
        deltas.push({ delta: event.delta, logprobs: event.logprobs ?? null });
      }
    }
    return { plain: outputText(plain), streamed: outputText(await stream.finalResponse()), deltas };
  },
});
