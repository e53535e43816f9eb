"""velo-chat session store: SQLite, plain dataclasses, never imports the engine.

`SessionStore(locations.database_path())` is the whole API; see `repository.py` for the threading
and durability rules, `session_lock.py` for one writer per session, `migrations.py` for how the
schema changes, `exchange.py` for the export format. Importing this package opens nothing.
"""

from .errors import (
    AmbiguousId,
    DraftNotFound,
    IncompatibleStore,
    InvalidArgument,
    InvalidImport,
    MessageNotFound,
    SessionBusy,
    SessionNotFound,
    StoreCorrupt,
    StoreError,
    StoreFull,
    StoreLocked,
    StoreReadOnly,
)
from .exchange import FORMAT, FORMAT_VERSION
from .models import (
    ROLES,
    STATUSES,
    Attachment,
    Draft,
    Message,
    NewMessage,
    Role,
    SearchHit,
    Session,
    Status,
    StoredToolCall,
    ToolResult,
    UndoRecord,
    make_title,
)
from .repository import SessionStore
from .search import SNIPPET_CLOSE, SNIPPET_OPEN

__all__ = [
    "FORMAT",
    "FORMAT_VERSION",
    "ROLES",
    "SNIPPET_CLOSE",
    "SNIPPET_OPEN",
    "STATUSES",
    "AmbiguousId",
    "Attachment",
    "Draft",
    "DraftNotFound",
    "IncompatibleStore",
    "InvalidArgument",
    "InvalidImport",
    "Message",
    "MessageNotFound",
    "NewMessage",
    "Role",
    "SearchHit",
    "Session",
    "SessionBusy",
    "SessionNotFound",
    "SessionStore",
    "Status",
    "StoreCorrupt",
    "StoreError",
    "StoreFull",
    "StoreLocked",
    "StoreReadOnly",
    "StoredToolCall",
    "ToolResult",
    "UndoRecord",
    "make_title",
]
