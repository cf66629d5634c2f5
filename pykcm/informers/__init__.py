"""The data path: reflector (list+watch) -> delta queue -> informer -> indexer cache -> handlers."""

from pykcm.informers.factory import SharedInformerFactory
from pykcm.informers.informer import SharedInformer
from pykcm.informers.store import DeletedFinalStateUnknown, Indexer, object_key, split_key, unwrap_tombstone

__all__ = [
    "DeletedFinalStateUnknown",
    "Indexer",
    "SharedInformer",
    "SharedInformerFactory",
    "object_key",
    "split_key",
    "unwrap_tombstone",
]
