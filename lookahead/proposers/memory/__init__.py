"""Memory across requests: a bounded store of a generator's earlier requests, proposed from as one more source."""

from .proposer import MemoryProposer, RequestMemory

__all__ = ["MemoryProposer", "RequestMemory"]
