"""Model clients: OpenAI-compatible chat completions and completions for workers and architects, a persistent
response cache, record/replay, and one OpenAI-compatible loopback server (:mod:`heldout.models.server`)
with two backends: the deterministic test double (:mod:`heldout.models.testserver`) and a real GGUF
model through llama.cpp (:mod:`heldout.models.backends.llama`, ``heldout serve-model``).
:class:`ChatClient` is what a session asks of a model; :class:`~heldout.models.workers.FunctionWorker`
makes a local function one."""

from heldout.models.cache import CachedResponse, CacheError, ResponseCache
from heldout.models.client import ModelClient
from heldout.models.pacing import backoff_delay
from heldout.models.types import (ARCHITECT, CHANNELS, DEPLOYMENT, JUDGE_CHANNEL, OPTIMISATION, BatchError, ChannelUsage,
                                  ChatClient, ChatRequest, ChatResponse, ModelError, UsageMeter, check_chat_client,
                                  model_failure_kind)
from heldout.models.recording import Recorder, Replay, ReplayError, ReplayMiss, read_recording

__all__ = [
    "ARCHITECT", "CHANNELS", "DEPLOYMENT", "JUDGE_CHANNEL", "OPTIMISATION", "BatchError", "CacheError",
    "CachedResponse", "ChannelUsage", "ChatClient", "ChatRequest",
    "ChatResponse", "ModelClient", "ModelError", "Recorder", "Replay", "ReplayError", "ReplayMiss",
    "ResponseCache", "UsageMeter", "backoff_delay", "check_chat_client", "model_failure_kind", "read_recording",
]
