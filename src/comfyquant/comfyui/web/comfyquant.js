// comfyquant's frontend extension: the Check node shows its report on the node itself.
// The node's Python side returns {"ui": {"text": [report]}}; ComfyUI hands that to
// onExecuted, and the report goes into a read-only multiline widget named "report".
import { app } from "../../scripts/app.js";
import { ComfyWidgets } from "../../scripts/widgets.js";

const SHOWS_REPORT = new Set(["ComfyQuantCheck", "ComfyQuantLoader", "ComfyQuantQuantizeSave"]);

function showReport(node, text) {
  let widget = node.widgets?.find((w) => w.name === "report");
  if (!widget) {
    widget = ComfyWidgets["STRING"](node, "report", ["STRING", { multiline: true }], app).widget;
    widget.inputEl.readOnly = true;
    widget.inputEl.style.fontFamily = "monospace";
    widget.inputEl.classList.add("comfyquant-report");
    widget.inputEl.dataset.nodeType = node.type;
    widget.serialize = false;
  }
  widget.value = text;
  node.setSize([Math.max(node.size[0], 560), Math.max(node.size[1], 300)]);
  node.setDirtyCanvas(true, true);
}

app.registerExtension({
  name: "comfyquant.report",
  async beforeRegisterNodeDef(nodeType, nodeData) {
    if (!SHOWS_REPORT.has(nodeData.name)) return;
    const onExecuted = nodeType.prototype.onExecuted;
    nodeType.prototype.onExecuted = function (message) {
      onExecuted?.apply(this, arguments);
      const text = message?.text;
      if (text && text.length) showReport(this, Array.isArray(text) ? text.join("\n") : String(text));
    };
  },
});
