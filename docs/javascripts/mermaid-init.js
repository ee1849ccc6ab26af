// The vendored mermaid.min.js would draw every .mermaid block on page load by itself;
// Material draws them (with its theme colours), so mermaid's own start is switched off.
mermaid.initialize({ startOnLoad: false });
