"""Model clients: OpenAI-compatible chat completions for workers and architects, a persistent
response cache, record/replay, and a loopback test server (:mod:`heldout.models.testserver`)."""

from heldout.models.cache import CachedResponse, CacheError, ResponseCache
from heldout.models.client import (
    CHANNELS,
    BatchError,
    ChannelUsage,
    ChatRequest,
    ChatResponse,
    ModelClient,
    ModelError,
    UsageMeter,
    backoff_delay,
)
from heldout.models.recording import Recorder, Replay, ReplayError, ReplayMiss, read_recording

__all__ = [
    "CHANNELS", "BatchError", "CacheError", "CachedResponse", "ChannelUsage", "ChatRequest",
    "ChatResponse", "ModelClient", "ModelError", "Recorder", "Replay", "ReplayError", "ReplayMiss",
    "ResponseCache", "UsageMeter", "backoff_delay", "read_recording",
]
