/**
 * What every client script shares: the SDKs resolved from the compatibility npm prefix
 * (`TRACERL_NPM_PREFIX`, by default the repository's .npm-compat), the gateway session from the
 * environment (`TRACERL_BASE_URL`, the OpenAI base URL; `TRACERL_ANTHROPIC_BASE_URL`;
 * `TRACERL_API_KEY`), and `run(cases)`, which plays the case named by the first argument and
 * prints what it observed as one JSON line. A case that throws exits 1 with the error (and, for
 * an HTTP error, the gateway's reply) on stderr.
 *
 * The scripts import the SDKs with `await import(...)`: static imports are resolved before this
 * module registers the resolution hooks.
 */

import { register } from "node:module";
import { resolve } from "node:path";
import { pathToFileURL } from "node:url";

const prefix = process.env.TRACERL_NPM_PREFIX
  ? pathToFileURL(resolve(process.env.TRACERL_NPM_PREFIX) + "/").href
  : new URL("../../../.npm-compat/", import.meta.url).href;
register("./npm_resolve.mjs", import.meta.url, {
  data: { scripts: new URL("./", import.meta.url).href, prefix },
});

export const OPENAI_BASE_URL = process.env.TRACERL_BASE_URL;
export const ANTHROPIC_BASE_URL = process.env.TRACERL_ANTHROPIC_BASE_URL;
export const API_KEY = process.env.TRACERL_API_KEY;
export const MODEL = "tiny";

export async function run(cases) {
  const [name, ...args] = process.argv.slice(2);
  if (!(name in cases)) {
    console.error(`unknown case ${name}; cases: ${Object.keys(cases).join(", ")}`);
    process.exit(2);
  }
  try {
    console.log(JSON.stringify(await cases[name](...args)));
  } catch (error) {
    // the SDKs' HTTP errors keep the gateway's reply apart from their message
    const body = error?.responseBody ?? error?.error ?? error?.cause?.responseBody;
    console.error(error?.stack ?? String(error));
    if (body !== undefined) {
      console.error("reply:", typeof body === "string" ? body : JSON.stringify(body));
    }
    process.exit(1);
  }
}
