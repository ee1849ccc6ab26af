"""An SVG from a run directory, made safe to inline into the report page.

The page embeds `population.svg` as inline SVG (a chart stays sharp and its text
searchable). The file lies in the run directory, and whoever can write there
must not be able to run a script in the browser of whoever opens the report: an
inline `<svg onload=...>`, a `<script>`, a `<foreignObject>` holding HTML, an
`<a href="javascript:...">` or an animation that sets such a link all run in
the page's origin. So the file is parsed as XML and written out again with only
what a chart needs, an allow-list rather than a list of known attacks:

- elements: the drawing elements matplotlib writes (and a few plain shapes);
  anything else is dropped with everything inside it (`script`,
  `foreignObject`, `a`, `image`, `style`, `animate`, `set`, metadata, ...);
- attributes: no namespace but SVG's own, xlink's and xml's; no event handler
  (`on*`); a link only to an element of the same drawing (`#id`); no value
  that fetches or escapes (`url(` other than `url(#id)`, `javascript:`,
  `@import`, `expression(`, a backslash, which CSS escapes start with);
- text is written escaped, comments and processing instructions are left out.

matplotlib's own `<style>` (`*{stroke-linejoin: round; stroke-linecap: butt}`) goes
too: the page's charts carry the same rule. A file that declares entities is refused
outright (no entity expansion on untrusted input).
"""

from __future__ import annotations

import html
import re
import xml.etree.ElementTree as ET

SVG_NS = "http://www.w3.org/2000/svg"
XLINK_NS = "http://www.w3.org/1999/xlink"
XML_NS = "http://www.w3.org/XML/1998/namespace"
#: a bigger file is not a chart shoal drew (population plots are a few hundred KB)
MAX_BYTES = 32 << 20

ELEMENTS = frozenset(
    {
        "svg", "g", "defs", "clipPath", "mask", "pattern", "marker", "symbol", "use",
        "path", "rect", "circle", "ellipse", "line", "polyline", "polygon",
        "text", "tspan", "title", "desc", "linearGradient", "radialGradient", "stop",
    }
)  # fmt: skip
_PREFIX = {SVG_NS: "", XLINK_NS: "xlink:", XML_NS: "xml:", "": ""}
_NAME = re.compile(r"^[A-Za-z][A-Za-z0-9_.-]*$")
_LOCAL_LINK = re.compile(r"^#[A-Za-z_][\w.:-]*$")
_URL = re.compile(r"url\s*\(", re.IGNORECASE)
_LOCAL_URL = re.compile(r"url\(#[A-Za-z_][\w.:-]*\)")
_FORBIDDEN = re.compile(r"javascript:|vbscript:|@import|expression\s*\(|\\", re.IGNORECASE)


class UnsafeSvg(ValueError):
    """The file cannot be made into a safe drawing (not XML, entities, too big)."""


def sanitized_svg(text: str) -> str:
    """The `<svg>` element of `text` rewritten with only the allowed elements, attributes
    and text (see the module docstring); raises UnsafeSvg when nothing safe can be made."""
    if len(text) > MAX_BYTES:
        raise UnsafeSvg(f"larger than {MAX_BYTES >> 20} MiB")
    if "<!ENTITY" in text:
        raise UnsafeSvg("it declares XML entities")
    try:
        root = ET.fromstring(text)
    except ET.ParseError as exc:
        raise UnsafeSvg(f"not XML ({exc})") from None
    if _split(root.tag) != (SVG_NS, "svg"):
        raise UnsafeSvg("its root element is not <svg>")
    out: list[str] = []
    _write(root, out, is_root=True)
    return "".join(out)


def _split(tag: object) -> tuple[str, str]:
    if not isinstance(tag, str):  # a comment or processing instruction
        return "", ""
    if tag.startswith("{"):
        namespace, _, local = tag[1:].partition("}")
        return namespace, local
    return "", tag


def _write(element: ET.Element, out: list[str], is_root: bool = False) -> None:
    namespace, name = _split(element.tag)
    if namespace != SVG_NS or name not in ELEMENTS:
        return  # dropped with its subtree; its tail is written by the parent
    attributes = "".join(
        f' {attribute}="{html.escape(value, quote=True)}"'
        for key, value in element.attrib.items()
        if (attribute := _safe_attribute(key, value)) is not None
    )
    if is_root:
        attributes = f' xmlns="{SVG_NS}" xmlns:xlink="{XLINK_NS}"' + attributes
    out.append(f"<{name}{attributes}>")
    if element.text:
        out.append(html.escape(element.text, quote=False))
    for child in element:
        _write(child, out)
        if child.tail:
            out.append(html.escape(child.tail, quote=False))
    out.append(f"</{name}>")


def _safe_attribute(key: str, value: str) -> str | None:
    """The attribute's name as written, or None to drop it."""
    namespace, name = _split(key)
    prefix = _PREFIX.get(namespace)
    if prefix is None or not _NAME.match(name) or name.lower().startswith("on"):
        return None
    if name == "href":
        return f"{prefix}{name}" if _LOCAL_LINK.match(value.strip()) else None
    if _FORBIDDEN.search(value):
        return None
    if len(_URL.findall(value)) != len(_LOCAL_URL.findall(value)):
        return None  # a url() that is not a reference into this drawing
    return f"{prefix}{name}"
