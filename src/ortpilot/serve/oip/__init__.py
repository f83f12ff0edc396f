"""The Open Inference Protocol stack (KServe v2 REST and gRPC, Triton-compatible): one application per
model whose verified replicas answer its requests themselves (``app``, ``replica``), a server-wide
application for health, metadata and ``/metrics`` (``server``), how a replica runs its model and
reports (``execution``, ``reporting``), the REST routes (``routes``) and
tensor codec (``codec``), gRPC (``grpc_service``: Ray registration and fixes; ``grpc_codec``:
messages <-> numpy; ``grpc_rpcs``: the guard wrapper and status mapping), dynamic batching (``batcher``), input
limits (``limits``), metrics (``metrics``), readiness (``readiness``) and the KubeRay manifest
(``rayservice``). It imports the serve core, never ``serve.openai``.
"""
