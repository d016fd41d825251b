/**
 * The Vercel AI SDK (`ai` with `@ai-sdk/openai`) against a gateway session:
 * `node ai_sdk.mjs CASE API [OPTION]`, API `chat` (`openai.chat(model)`, Chat Completions) or
 * `responses` (`openai(model)`, the provider's default: the Responses API).
 *
 * - text: `generateText`; stream: `streamText`, its text deltas and error parts kept;
 * - object: `generateObject` with a zod schema (a json_schema response format); output_object:
 *   the same through `generateText` with `output: Output.object(...)`, which ai 7 recommends
 *   (it deprecates generateObject);
 * - tool: `generateText` with a tool the SDK runs, over two steps (the call, then the answer);
 *   OPTION `store=false` sets the Responses provider option `store: false`, with which the SDK
 *   sends back the earlier output items whole rather than as `item_reference`s to them.
 */

import { API_KEY, MODEL, OPENAI_BASE_URL, run } from "./compat.mjs";

const { Output, generateObject, generateText, isStepCount, streamText, tool } =
  await import("ai");
const { createOpenAI } = await import("@ai-sdk/openai");
const { z } = await import("zod");

const openai = createOpenAI({ baseURL: OPENAI_BASE_URL, apiKey: API_KEY });
// the SDK retries failed calls by default, which would replay the scripted engine's replies
const once = { maxRetries: 0 };

function model(api) {
  if (api === "chat") return openai.chat(MODEL);
  if (api === "responses") return openai(MODEL);
  throw new Error(`unknown API ${api}`);
}

const usage = (u) => ({ inputTokens: u.inputTokens, outputTokens: u.outputTokens });

const person = z.object({ name: z.string(), age: z.number().int() });

const weather = tool({
  description: "Current weather of a city",
  inputSchema: z.object({ city: z.string() }),
  execute: async ({ city }) => ({ city, sky: "sunny" }),
});

await run({
  async text(api) {
    const m = model(api);
    const r = await generateText({ model: m, prompt: "Say hello.", ...once });
    const { text, finishReason } = r;
    return { provider: m.provider, text, finishReason, usage: usage(r.usage) };
  },

  async stream(api) {
    const r = streamText({ model: model(api), prompt: "Say hello.", ...once });
    const deltas = [];
    const errors = [];
    for await (const part of r.fullStream) {
      if (part.type === "text-delta") deltas.push(part.text);
      if (part.type === "error") errors.push(String(part.error?.message ?? part.error));
    }
    const text = await r.text;
    const finishReason = await r.finishReason;
    return { deltas, errors, text, finishReason, usage: usage(await r.usage) };
  },

  async object(api) {
    const r = await generateObject({
      model: model(api),
      schema: person,
      schemaName: "person",
      prompt: "Who wrote the first computer program, and at what age did she die?",
      ...once,
    });
    return { object: r.object, finishReason: r.finishReason };
  },

  async output_object(api) {
    const r = await generateText({
      model: model(api),
      output: Output.object({ schema: person, name: "person" }),
      prompt: "Who wrote the first computer program, and at what age did she die?",
      ...once,
    });
    return { object: r.output, finishReason: r.finishReason };
  },

  async tool(api, option) {
    const r = await generateText({
      model: model(api),
      prompt: "What is the weather in Paris?",
      tools: { get_weather: weather },
      stopWhen: isStepCount(2),
      ...(option === "store=false" && { providerOptions: { openai: { store: false } } }),
      ...once,
    });
    return {
      text: r.text,
      steps: r.steps.map((s) => ({
        finishReason: s.finishReason,
        text: s.text,
        toolCalls: s.toolCalls.map((c) => ({ name: c.toolName, input: c.input })),
        toolResults: s.toolResults.map((t) => t.output),
      })),
    };
  },
});
