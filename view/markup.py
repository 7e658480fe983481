"""The viewer's HTML layer: the one escaping helper, URL quoting, the page frame, its script and its
Content-Security-Policy.

Everything the viewer shows comes from data it does not trust (episode, run, policy and spec ids, env
servers' observations, imported files, query parameters), so every value reaches a page through `esc` (text
and attribute values alike; attributes are always double-quoted) and every id placed in a URL through `url_part`
first. The policy (`CSP`) is the second line: no inline script runs but the page's own block (allowed by
its SHA-256), no style but the page's own block, no event-handler attributes, nothing loaded from anywhere.
Served pages send it as a header; every page, exported ones included, carries it in a <meta> element.
"""

from __future__ import annotations

import base64
import hashlib
import html
from typing import Any
from urllib.parse import quote

STYLE = """
body{font-family:system-ui,sans-serif;margin:1.5em;color:#222} table{border-collapse:collapse;font-size:.9em}
td,th{border:1px solid #ccc;padding:.2em .5em;text-align:left} th a{color:inherit} .muted{color:#777}
.turn{border:1px solid #ddd;border-radius:6px;padding:.6em;margin:.6em 0} .obs{white-space:pre-wrap;background:#f6f6f6;
padding:.4em} .reply{font-family:monospace;white-space:pre-wrap;line-height:1.7} .tok{border-radius:2px}
.side{display:flex;gap:1em} .side>div{flex:1;min-width:0} form.filters{margin:.5em 0} form.filters input{width:7em}
.notclean{color:#a00;background:#fdecea;font-weight:bold} p.notclean{border:1px solid #e0a0a0;padding:.5em}
.clean{color:#2a7a2a}
.charts{display:flex;flex-wrap:wrap;gap:.5em} svg.chart{border:1px solid #eee;background:#fff}
svg text{font-size:10px;font-family:system-ui,sans-serif} svg .ct{font-size:12px;font-weight:bold;fill:#222}
svg .cg{stroke:#eee} svg .ca{stroke:#999} svg .cl{fill:#555} svg .cn{fill:#999} svg.spark{vertical-align:middle}
.panes{display:flex;flex-wrap:wrap;gap:1.5em;align-items:flex-start} .panes>#curves{flex:1 1 740px;min-width:0}
.panes>#evals{flex:0 1 560px;min-width:0;overflow-x:auto} td.curve{white-space:nowrap}
tr.group th{background:#eef2f7} tr.child td:first-child{padding-left:1.5em}
tr.depth-2 td:first-child{padding-left:3em} tr.depth-3 td:first-child{padding-left:4.5em}
td.ok a,.win{color:#2a7a2a} td.bad a,.loss{color:#a00} td.part a{color:#a60} tr.differs td{background:#fffbe6}
td.num{white-space:nowrap} section.evalgroup{border-top:1px solid #ccc;margin-top:1em}
"""

# The one script of every page. It reads the page only through data-* attributes and textContent, never
# builds HTML, and attaches its listeners itself (the CSP forbids onclick= attributes). Token shading is
# applied here because the CSP forbids style= attributes; the colours are computed by the server
# (pages.shade) and only ever assigned through the CSSOM.
SCRIPT = """
'use strict';
function applyFilters(){const f=document.getElementById('filters');const v=n=>f.elements[n].value.trim();
const lo=parseFloat(v('min_reward')),hi=parseFloat(v('max_reward'));let shown=0;
for(const r of document.querySelectorAll('#episodes tbody tr')){const d=r.dataset;let ok=true;
if(v('env')&&d.env!==v('env'))ok=false;if(v('policy')&&!d.policy.includes(v('policy')))ok=false;
if(v('success')&&d.success!==v('success'))ok=false;const rw=parseFloat(d.reward);
if(!isNaN(lo)&&!(rw>=lo))ok=false;if(!isNaN(hi)&&!(rw<=hi))ok=false;r.style.display=ok?'':'none';if(ok)shown++;}
document.getElementById('shown').textContent=shown;}
function sortBy(k,num){const b=document.querySelector('#episodes tbody');const rows=[...b.rows];
const dir=b.dataset.sort===k?-1:1;b.dataset.sort=dir===1?k:'';
rows.sort((x,y)=>{let a=x.dataset[k],c=y.dataset[k];if(num){a=parseFloat(a);c=parseFloat(c);
a=isNaN(a)?-Infinity:a;c=isNaN(c)?-Infinity:c;}return (a<c?-1:a>c?1:0)*dir;});rows.forEach(r=>b.appendChild(r));}
document.addEventListener('DOMContentLoaded',()=>{
const f=document.getElementById('filters');
if(f){f.addEventListener('submit',e=>e.preventDefault());
for(const e of ['input','change','keyup'])f.addEventListener(e,applyFilters);}
for(const a of document.querySelectorAll('a[data-sort]'))a.addEventListener('click',e=>{e.preventDefault();
sortBy(a.dataset.sort,a.dataset.num==='1');});
for(const s of document.querySelectorAll('span.tok[data-shade]'))s.style.backgroundColor=s.dataset.shade;});
"""


def _sha256(text: str) -> str:
    """A CSP source for an inline block: the hash of its exact text, as the browser computes it."""
    return "'sha256-" + base64.b64encode(hashlib.sha256(text.encode("utf-8")).digest()).decode() + "'"


#: what a page may do: run its own script and style (by hash), load nothing, submit nothing, set no <base>
CSP = (f"default-src 'none'; script-src {_sha256(SCRIPT)}; style-src {_sha256(STYLE)}; "
       "base-uri 'none'; form-action 'none'")
#: served pages add what only a header can say (a <meta> policy ignores frame-ancestors): no framing
CSP_HEADER = CSP + "; frame-ancestors 'none'"


def esc(v: Any) -> str:
    """Any value as HTML text or a double-quoted attribute value (None: empty)."""
    return html.escape("" if v is None else str(v), quote=True)


def url_part(v: Any) -> str:
    """A value as one URL path segment or query value: every reserved byte percent-encoded, so an id holding
    `/`, `?`, `#`, `&` or `%` stays one component. The result still goes through `esc` into an attribute."""
    return quote("" if v is None else str(v), safe="")


def attrs(**values: Any) -> str:
    """` name="value"` for each keyword, every value escaped; `_` in a name becomes `-` (data_id -> data-id)
    and a trailing one goes (class_ -> class, for Python's keyword)."""
    return "".join(f' {k.rstrip("_").replace("_", "-")}="{esc(v)}"' for k, v in values.items())


def link(href: str, text: Any, **extra: Any) -> str:
    """An <a> to `href` (a URL built with url_part) showing `text`."""
    return f"<a{attrs(href=href, **extra)}>{esc(text)}</a>"


def page(title: str, body: str) -> str:
    """A whole page: `body` is HTML already built from escaped parts. The policy comes first in <head> (a
    <meta> policy applies only to what follows it)."""
    return (f"<!doctype html><html><head><meta charset=\"utf-8\">"
            f"<meta{attrs(http_equiv='Content-Security-Policy', content=CSP)}>"
            f"<meta name=\"referrer\" content=\"no-referrer\"><title>{esc(title)}</title><style>{STYLE}</style>"
            f"<script>{SCRIPT}</script></head><body>{body}</body></html>")


def error_page(title: str, message: str | None = None) -> str:
    """A 404/500 page: `message` (escaped) says what was not found; the request itself is never echoed."""
    text = f"<p>{esc(message)}</p>" if message else ""
    return page(title, f"<h1>{esc(title)}</h1>{text}<p>{link('/', 'runs')}</p>")


__all__ = ["CSP", "CSP_HEADER", "SCRIPT", "STYLE", "attrs", "error_page", "esc", "link", "page", "url_part"]
