// The test host for pollwarden's MCP App: the ext-apps app-bridge (the host side of the protocol)
// rendering one `ui://` page in a sandboxed iframe, as Claude, ChatGPT or VS Code do. Tool calls the
// page makes are handed to `window.hostCallTool`, which the Python test binds to a real MCP client
// connected to `pollwarden serve`. Bundled into one file by build-host.sh; never shipped.
import {
  AppBridge,
  PostMessageTransport,
  isToolVisibilityAppOnly,
} from "@modelcontextprotocol/ext-apps/app-bridge";

// The CSP a host builds from a resource's `_meta.ui.csp` (no domains declared: nothing external).
function cspFor(csp) {
  const connect = (csp && csp.connectDomains) || [];
  const resources = (csp && csp.resourceDomains) || [];
  return [
    "default-src 'none'",
    `script-src 'unsafe-inline' ${resources.join(" ")}`.trim(),
    `style-src 'unsafe-inline' ${resources.join(" ")}`.trim(),
    `img-src data: ${resources.join(" ")}`.trim(),
    `connect-src ${connect.join(" ") || "'none'"}`,
    "frame-src 'none'",
    "base-uri 'none'",
    "form-action 'none'",
  ].join("; ");
}

window.pollwardenHost = {
  calls: [],
  // The tools a host lists to the model: every one not marked for the app alone.
  modelVisible(tools) {
    return tools.filter((tool) => !isToolVisibilityAppOnly(tool)).map((tool) => tool.name);
  },
  async mount({ html, csp, toolInput, toolResult, theme, width }) {
    const frame = document.createElement("iframe");
    frame.setAttribute("sandbox", "allow-scripts");
    frame.setAttribute("title", "pollwarden card");
    frame.style.width = `${width}px`;
    frame.style.height = "600px";
    frame.style.border = "0";
    document.body.style.background = theme === "dark" ? "#111" : "#fff";
    document.body.appendChild(frame);
    const bridge = new AppBridge(
      null,
      { name: "pollwarden-test-host", version: "1.0.0" },
      { serverTools: {}, sandbox: { csp: csp || {} } },
      { hostContext: { theme, displayMode: "inline", containerDimensions: { width, maxHeight: 600 } } },
    );
    bridge.oncalltool = async (params) => {
      this.calls.push(params.name);
      return await window.hostCallTool(params.name, params.arguments || {});
    };
    bridge.onsizechange = ({ height }) => {
      if (height) frame.style.height = `${Math.ceil(height)}px`;
    };
    const ready = new Promise((resolve) => {
      bridge.oninitialized = resolve;
    });
    // Listen before the page loads: its first message (ui/initialize) goes out as its script runs.
    await bridge.connect(new PostMessageTransport(frame.contentWindow, frame.contentWindow));
    const policy = `<meta http-equiv="Content-Security-Policy" content="${cspFor(csp)}">`;
    frame.srcdoc = html.replace(/<head>/i, `<head>${policy}`);
    await ready;
    await bridge.sendToolInput({ arguments: toolInput || {} });
    await bridge.sendToolResult(toolResult);
    this.bridge = bridge;
    this.frame = frame;
    return true;
  },
  async setTheme(theme) {
    document.body.style.background = theme === "dark" ? "#111" : "#fff";
    this.bridge.setHostContext({ theme, displayMode: "inline" });
  },
  async sendToolResult(result) {
    await this.bridge.sendToolResult(result);
  },
};
