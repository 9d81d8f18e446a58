// Turns the TypeScript types of the npm package @grafana/schema into JSON Schema (one file),
// for tests/e2e/test_dashboards.py: the dashboard model, and each panel plugin's options and
// field config. Usage: node schema.cjs <node_modules> <out.json>
const { createRequire } = require("node:module");
const { writeFileSync } = require("node:fs");
const { join } = require("node:path");

const [modules, out] = process.argv.slice(2);
const fromModules = createRequire(join(modules, "noop.js"));
const { createGenerator } = fromModules("ts-json-schema-generator");
const pkg = join(modules, "@grafana", "schema");
const types = join(pkg, "dist", "types", "raw");
const { version } = fromModules("@grafana/schema/package.json");

function schemaOf(path, type) {
  return createGenerator({ path, type, skipTypeCheck: true, additionalProperties: false, expose: "all" })
    .createSchema(type);
}

// The schemaVersion Grafana writes today: the package's default dashboard carries it.
const { defaultDashboard } = fromModules("@grafana/schema");
const result = { version, schemaVersion: defaultDashboard.schemaVersion, dashboard: schemaOf(join(types, "dashboard", "x", "types.gen.d.ts"), "Dashboard"), panels: {} };
// Panel type id -> the folder of its panelcfg types.
const panels = { table: "table", timeseries: "timeseries", stat: "stat", bargauge: "bargauge",
  heatmap: "heatmap", piechart: "piechart", "state-timeline": "statetimeline" };
for (const [id, dir] of Object.entries(panels)) {
  const file = join(types, "composable", dir, "panelcfg", "x", "types.gen.d.ts");
  const program = { options: schemaOf(file, "Options") };
  try { program.fieldConfig = schemaOf(file, "FieldConfig"); } catch { /* no custom field config */ }
  result.panels[id] = program;
}
writeFileSync(out, JSON.stringify(result));
