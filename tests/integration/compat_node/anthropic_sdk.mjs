/**
 * The official anthropic Node SDK against a gateway session: `node anthropic_sdk.mjs CASE`.
 *
 * - tool_use: a streamed message whose reply is a tool call (`client.messages.stream`): its
 *   events and the SDK's final message, whose tool input the SDK parses from the deltas.
 */

import { ANTHROPIC_BASE_URL, API_KEY, MODEL, run } from "./compat.mjs";

const { default: Anthropic } = await import("@anthropic-ai/sdk");

const client = new Anthropic({ baseURL: ANTHROPIC_BASE_URL, apiKey: API_KEY, maxRetries: 0 });

const weather = {
  name: "get_weather",
  description: "Current weather of a city",
  input_schema: { type: "object", properties: { city: { type: "string" } }, required: ["city"] },
};

function eventSummary(e) {
  const out = { type: e.type };
  if (e.content_block) out.block = e.content_block;
  if (e.delta?.type) out.delta = e.delta;
  return out;
}

await run({
  async tool_use() {
    const stream = client.messages.stream({
      model: MODEL,
      max_tokens: 256,
      messages: [{ role: "user", content: "What is the weather in Tokyo?" }],
      tools: [weather],
    });
    const events = [];
    for await (const event of stream) events.push(eventSummary(event));
    const final = await stream.finalMessage();
    return { events, stopReason: final.stop_reason, content: final.content };
  },
});
