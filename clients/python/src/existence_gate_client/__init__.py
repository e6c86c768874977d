"""existence-gate client: coalesced lookups (`GateClient`) and the gated read path (`GatedReader`).

    from existence_gate_client import GateClient, GatedReader

    client = GateClient(["gate-a:50051", "gate-b:50051"], "users")
    reader = GatedReader(client, db.load_user)   # load_user(key) -> row, None (missing) or DELETED
    user = reader.get("user:42")                 # None when the key does not exist
"""

from ._client import (
    MAX_BATCH_KEYS,
    AbsenceKind,
    AddressPolicy,
    Answer,
    GateClient,
    GateError,
    RecordOutcome,
    Recorded,
    Stats,
)
from ._reader import DELETED, MISSING, MAX_PENDING_ADDS, AbsenceCache, GatedReader, SingleFlight

__all__ = [
    "AbsenceCache",
    "AbsenceKind",
    "AddressPolicy",
    "Answer",
    "DELETED",
    "GateClient",
    "GateError",
    "GatedReader",
    "MAX_BATCH_KEYS",
    "MAX_PENDING_ADDS",
    "MISSING",
    "RecordOutcome",
    "Recorded",
    "SingleFlight",
    "Stats",
]
