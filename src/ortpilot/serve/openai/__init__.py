"""The OpenAI stack: decoders behind an OpenAI-compatible API at ``/v1``. The wire format (``wire``),
the ingress (``ingress``) and the generation it relays to a replica (``relay``), what a replica loads
(``spec``, checked in the driver), one deployment per decoder (``deployment``) whose replicas adapt
the continuous-batching engine (``decoder``), engine metrics (``metrics``) and the server's readiness
and drain (``server``). It imports the serve core, never ``serve.oip``.
"""
