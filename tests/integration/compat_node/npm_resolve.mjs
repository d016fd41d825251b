/**
 * Module resolution hooks (registered by compat.mjs): a bare package name imported by one of
 * these scripts is resolved from the compatibility npm prefix, where `make test-compat` installs
 * the SDKs. ES modules read no NODE_PATH, and the scripts live outside that prefix; the packages
 * inside it resolve their own dependencies as usual.
 */

let scripts;
let prefix;

export async function initialize(data) {
  scripts = data.scripts;
  prefix = data.prefix;
}

function isBare(specifier) {
  return !/^[./]/.test(specifier) && !specifier.includes(":");
}

export async function resolve(specifier, context, nextResolve) {
  if (isBare(specifier) && context.parentURL?.startsWith(scripts)) {
    return nextResolve(specifier, { ...context, parentURL: prefix });
  }
  return nextResolve(specifier, context);
}
