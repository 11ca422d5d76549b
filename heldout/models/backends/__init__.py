"""Backends of :class:`heldout.models.server.ChatServer`: ``deterministic`` (the test double)
and ``llama`` (a real GGUF model on the CPU through llama.cpp, the ``[local-model]`` extra)."""
