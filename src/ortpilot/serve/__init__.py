"""``ortpilot serve``: decoders behind an OpenAI-compatible API on Ray Serve (continuous batching).

``openai_app.openai_deployment(specs)`` is the Ray Serve application (mount it at ``/v1``);
``decoder.prepare_decoder`` checks and fuses a decoder before Ray starts; ``openai`` holds the
wire format. Ray is imported only when an application is built or run, so ``import
ortpilot.serve`` works without the ``serve`` extra.
"""
