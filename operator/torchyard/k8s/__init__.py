"""The only code that talks to the Kubernetes API: a thin, typed layer over the official
``kubernetes`` client's REST transport. This file is its face; the code lives in:

- ``resources``: where each kind lives in the REST API (``PODS``, ``TRAININGRUNS`` ...)
- ``connections``: the configured client, the default namespace, the service proxy
- ``clients``: :class:`Client`, the calls bound to a client of their own (the operator's)
- ``rest``: get, list, create, server-side apply with one field manager, delete
- ``errors``: :class:`ApiError`, the apiserver's error answer with its HTTP status
- ``watches``: a list with its resourceVersion and a watch stream from it (outside Kopf)
- ``events``, ``logs``, ``reviews``: Events, Pod logs, Token/SubjectAccessReview and
  TokenRequest
- ``execs``: a command's output from a Pod's container (the exec API)

Callers use the package (``from torchyard import k8s; k8s.apply(...)``): the SDK, the CLI
and the registry's authorizer; the controller only through a ``k8s.Client`` of its own.
Each module's ``__all__`` is what it re-exports here; tests/unit/k8s/test_face.py pins
the whole face.
"""

from torchyard.k8s.clients import *  # noqa: F403
from torchyard.k8s.connections import *  # noqa: F403
from torchyard.k8s.errors import *  # noqa: F403
from torchyard.k8s.events import *  # noqa: F403
from torchyard.k8s.execs import *  # noqa: F403
from torchyard.k8s.logs import *  # noqa: F403
from torchyard.k8s.resources import *  # noqa: F403
from torchyard.k8s.rest import *  # noqa: F403
from torchyard.k8s.reviews import *  # noqa: F403
from torchyard.k8s.watches import *  # noqa: F403
