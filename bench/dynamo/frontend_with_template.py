"""Run `python -m dynamo.frontend` with a request template (EntrypointArgs.template_file).

Dynamo 1.6.1's frontend CLI has no flag for it; the KServe gRPC path ignores request
`parameters` and takes max_tokens/temperature/model only from this template.
Usage: DYN_REQUEST_TEMPLATE=/path/template.json python frontend_with_template.py <frontend args>
"""

import os

import dynamo.frontend.main as m

_orig = m.EntrypointArgs
_tf = os.environ["DYN_REQUEST_TEMPLATE"]


def _patched(*args, **kwargs):
    kwargs.setdefault("template_file", _tf)
    return _orig(*args, **kwargs)


m.EntrypointArgs = _patched
m.main()
