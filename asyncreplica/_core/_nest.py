"""Nested structures: flatten, rebuild, regroup and select.

The containers we traverse are TensorFlow's for ``run``'s arguments and results:
``list``, ``tuple`` (namedtuples keep their type), and every
:class:`collections.abc.Mapping` (rebuilt as ``type(m)(dict)``, keys visited in sorted
order, the original key order kept); plus the containers a registered *node finder*
recognises (:func:`register_node_finder`: JAX's registered pytree nodes, where JAX is
imported). Everything else -- arrays, numbers, ``None``, plain dataclasses, sets,
``PerReplica`` -- is a leaf.

A structure's shape is a *treedef*: nested tuples that are hashable and compare
with ``==``, so the ledger can check that replicas passed the same structure without
touching a single leaf. A treedef node is ``None`` for a leaf, or
``(container_type, keys, children)`` where ``keys`` is ``None`` for sequences, for
mappings ``(sorted keys, KeyOrder, default_factory or None)``, and for a found node its
:class:`Node` (which compares its own metadata and rebuilds it).

Rebuilding (``unflatten``, in :func:`_build`, the one place) calls the container's
constructor and checks what it gave back: the type itself holding exactly the items given,
each the very object; anything else is a ``TypeError`` naming the type, never a structure
changed silently (a ``tuple`` subclass whose ``__new__`` takes ``*items``, a dict subclass
that adds a key). Since a rebuild sees only the items, flattening refuses (``TypeError``,
in :func:`_refuse_own_state`) a container subclass instance that carries state of its own
besides them (an instance attribute, a filled slot, a ``ChainMap``'s further maps), which
would come back reset; plain ``list``, ``tuple`` and ``dict`` skip the check.

Two mappings with the same keys are the same structure whatever order their keys
were inserted in, as in TensorFlow's ``nest`` (which sorts dict keys): the insertion
order is kept in a :class:`KeyOrder`, which rebuilds the mapping as it was but takes
no part in ``==`` or ``hash``. So replicas that built equal dicts in different orders
pass the same structure, in one process and across processes alike, and each one's
result comes back in its own key order.
"""

from __future__ import annotations

from collections import ChainMap, defaultdict
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from types import MemberDescriptorType
from typing import TypeAlias

__all__ = [
    "MAX_NEST_DEPTH",
    "KeyOrder",
    "Node",
    "NodeFinder",
    "TreeDef",
    "flatten",
    "treedef_key",
    "is_nest",
    "map_structure",
    "register_node_finder",
    "regroup",
    "select_replica",
    "self_unequal_keys",
    "self_unequal_hint",
    "treedef_str",
    "unflatten",
]

# None for a leaf; (type, keys, children) for a container.
TreeDef: TypeAlias = "tuple[type, object, tuple[TreeDef, ...]] | None"

#: How many containers deep a nest may be: :func:`flatten`, which every traversal
#: (collectives, ``run``'s arguments and results, ``regroup``) goes through, refuses a
#: deeper one with ``ValueError``. One bound for both builds: the compiled traversal
#: recurses in C, where no recursion limit would stop it before the stack overflows,
#: and the interpreted one would hit Python's recursion limit at a depth that depends
#: on the caller's stack. A container that contains itself is refused by it too.
MAX_NEST_DEPTH = 100


class Node:
    """A container that a node finder recognised: how to compare it and rebuild it.

    Two nodes are equal (and hash alike) exactly when their ``key`` is: the container's
    structure (type and metadata), not its children, as a treedef's other parts.

    Args:
        key: Hashable; equal for containers of the same structure.
        rebuild: ``rebuild(children)`` is a new container of this structure.
        label: The container's name for people, with the metadata that tells two apart.
    """

    __slots__ = ("key", "label", "rebuild")

    def __init__(self, key: object, rebuild: Callable[[list[object]], object], label: str) -> None:
        self.key = key
        self.rebuild = rebuild
        self.label = label

    def build(self, children: list[object]) -> object:
        """A new container of this structure holding ``children``."""
        return self.rebuild(children)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Node) and bool(self.key == other.key)

    def __hash__(self) -> int:
        return hash(self.key)

    def __repr__(self) -> str:
        return f"Node({self.label})"


#: ``finder(value) -> (children, node)`` for a container it knows, else None.
NodeFinder: TypeAlias = "Callable[[object], tuple[list[object], Node] | None]"

_FINDERS: list[NodeFinder] = []
# Types every finder said are not containers: a cache (cleared on registration).
_NOT_NODES: set[type] = set()


def register_node_finder(finder: NodeFinder) -> None:
    """Traverse the containers ``finder`` recognises (see :data:`NodeFinder`).

    The finder is asked about values that are not a list, tuple, Mapping or None; it
    must not import anything (it is asked on the collective's path). A type it declines
    once is remembered as a leaf type until the next registration.
    """
    if finder not in _FINDERS:
        _FINDERS.append(finder)
    _NOT_NODES.clear()


def _found_node(value: object) -> tuple[list[object], Node] | None:
    """``(children, node)`` when a registered finder recognises ``value``."""
    kind = type(value)
    if not _FINDERS or value is None or kind in _NOT_NODES:
        return None
    for finder in _FINDERS:
        found = finder(value)
        if found is not None:
            return found
    if len(_NOT_NODES) < 4096:
        _NOT_NODES.add(kind)
    return None


def is_nest(value: object) -> bool:
    """Return True for the containers we traverse (list, tuple, Mapping, found nodes)."""
    return isinstance(value, list | tuple | Mapping) or _found_node(value) is not None


def _sorted_keys(keys: tuple[object, ...]) -> tuple[object, ...]:
    try:
        return tuple(sorted(keys))  # type: ignore[type-var]
    except TypeError:
        # Keys of mixed types: any deterministic order will do, as long as every
        # replica uses the same one.
        return tuple(sorted(keys, key=lambda k: (type(k).__qualname__, repr(k))))


class KeyOrder:
    """A mapping's key insertion order: kept to rebuild the mapping, never compared.

    Every ``KeyOrder`` equals every other and they all hash alike, so a treedef's
    ``==`` and ``hash`` see a mapping's key set, not the order its keys were inserted.

    Args:
        keys: The keys in insertion order, or None when that is the sorted order.
    """

    __slots__ = ("keys",)

    def __init__(self, keys: tuple[object, ...] | None) -> None:
        self.keys = keys

    def __eq__(self, other: object) -> bool:
        return isinstance(other, KeyOrder)

    def __hash__(self) -> int:
        return 0

    def __repr__(self) -> str:
        return f"KeyOrder({self.keys!r})"


_SORTED = KeyOrder(None)


def _mapping_keys(mapping: Mapping[object, object]) -> tuple[object, ...]:
    """The treedef metadata of a mapping: ``(sorted keys, KeyOrder, factory)``.

    Leaves are visited in sorted key order (so replicas that built equal dicts in
    different orders flatten alike); the insertion order is kept, in a
    :class:`KeyOrder` that takes no part in comparisons, so that the rebuilt mapping
    iterates as the original did. The mapping is iterated once: a user's mapping whose
    iteration changes from one pass to the next still gives one consistent treedef.
    """
    insertion = tuple(mapping)
    keys = _sorted_keys(insertion)
    factory = mapping.default_factory if isinstance(mapping, defaultdict) else None
    return (keys, _SORTED if insertion == keys else KeyOrder(insertion), factory)


def flatten(
    value: object,
    is_leaf: Callable[[object], bool] | None = None,
    where: str = "a value",
) -> tuple[list[object], TreeDef]:
    """Flatten ``value`` into its leaves and a treedef.

    Args:
        value: Any structure of lists, tuples and mappings.
        is_leaf: When given, a container for which it returns True is kept whole, as
            one leaf (the root too).
        where: What ``value`` is, for the error message (``"replica 1's result"``).

    Returns:
        ``(leaves, treedef)``; ``unflatten(treedef, leaves)`` rebuilds ``value``.

    Raises:
        ValueError: ``value`` is more than :data:`MAX_NEST_DEPTH` containers deep.
    """
    leaves: list[object] = []
    return leaves, _flatten_into(value, leaves, 0, is_leaf, where)


def _flatten_into(
    value: object,
    leaves: list[object],
    depth: int,
    is_leaf: Callable[[object], bool] | None,
    where: str,
) -> TreeDef:
    if is_leaf is not None and is_leaf(value):
        leaves.append(value)
        return None
    if isinstance(value, list | tuple | Mapping):
        if depth >= MAX_NEST_DEPTH:
            raise ValueError(_too_deep(where))
        kind = type(value)
        if isinstance(value, Mapping):
            meta = _mapping_keys(value)
            ordered = meta[0]
            assert isinstance(ordered, tuple)
            if kind is dict:
                children = tuple(
                    _flatten_into(value[k], leaves, depth + 1, is_leaf, where) for k in ordered
                )
                return (kind, meta, children)
            # Another mapping: its values read once, then checked for state of its own.
            read = [value[k] for k in ordered]
            _refuse_own_state(value, kind, where, (ordered, read))
            children = tuple(_flatten_into(v, leaves, depth + 1, is_leaf, where) for v in read)
            return (kind, meta, children)
        if kind is not list and kind is not tuple:
            _refuse_own_state(value, kind, where, None)
        items = tuple(_flatten_into(v, leaves, depth + 1, is_leaf, where) for v in value)
        return (kind, None, items)
    found = _found_node(value)
    if found is not None:
        if depth >= MAX_NEST_DEPTH:
            raise ValueError(_too_deep(where))
        parts, node = found
        nodes = tuple(_flatten_into(v, leaves, depth + 1, is_leaf, where) for v in parts)
        return (type(value), node, nodes)
    leaves.append(value)
    return None


# Per container subclass: whether its instances have a __dict__, and its filled-or-not
# __slots__ (name, descriptor). A cache, bounded as _NOT_NODES.
_LAYOUTS: dict[type, tuple[bool, tuple[tuple[str, MemberDescriptorType], ...]]] = {}


def _layout(kind: type) -> tuple[bool, tuple[tuple[str, MemberDescriptorType], ...]]:
    """Where instances of ``kind`` can keep state: an instance ``__dict__``, ``__slots__``."""
    layout = _LAYOUTS.get(kind)
    if layout is not None:
        return layout
    slots: list[tuple[str, MemberDescriptorType]] = []
    for base in kind.__mro__:
        own = vars(base)
        declared = own.get("__slots__", ())
        for name in (declared,) if isinstance(declared, str) else declared:
            if not isinstance(name, str) or name in ("__dict__", "__weakref__"):
                continue
            if name.startswith("__") and not name.endswith("__"):
                name = f"_{base.__name__.lstrip('_')}{name}"  # as Python mangles it
            descriptor = own.get(name)
            if isinstance(descriptor, MemberDescriptorType):
                slots.append((name, descriptor))
    layout = (kind.__dictoffset__ != 0, tuple(slots))
    if len(_LAYOUTS) < 4096:
        _LAYOUTS[kind] = layout
    return layout


# A mapping's keys and values as flattening read them, or None for a list or tuple.
_Read: TypeAlias = "tuple[tuple[object, ...], list[object]] | None"


def _own_state(value: object, kind: type, read: _Read) -> list[str]:
    """The attributes of a container subclass instance that hold state besides its items.

    A ``list``, ``tuple`` or ``dict`` subclass keeps its items in the built-in storage, so
    any instance attribute is state of its own (save the ``AttrDict`` idiom, whose
    ``__dict__`` is the dict itself). Another ``Mapping`` keeps its items in its
    attributes: one attribute that holds exactly its items (a dict, as ``UserDict``'s
    ``data``; a ``ChainMap``'s list of one map) is its storage, anything more is state.
    ``read`` is a mapping's keys and values as flattening read them (it is iterated once).
    """
    has_dict, slots = _layout(kind)
    state: dict[str, object] = {}
    if has_dict:
        try:
            attributes = vars(value)
        except TypeError:
            attributes = {}
        if attributes is not value:
            state.update(attributes)
    for name, descriptor in slots:
        try:
            held = descriptor.__get__(value, kind)
        except AttributeError:
            continue  # a slot left unset
        state[name] = held
    if not state:
        return []
    if read is None or isinstance(value, dict) or len(state) != 1:
        return list(state)
    (store,) = state.values()
    if isinstance(value, ChainMap) and isinstance(store, list) and len(store) == 1:
        store = store[0]
    items = dict(zip(read[0], read[1], strict=True))
    if store is not value and isinstance(store, Mapping) and _holds(store, items):
        return []
    return list(state)


def _refuse_own_state(value: object, kind: type, where: str, read: _Read) -> None:
    """Raise ``TypeError`` when a container subclass instance carries state of its own.

    Rebuilding gives ``type(m)(items)``: state outside the items would come back as the
    constructor sets it (a loss scale reset to 1.0), a silently wrong number. So it is
    refused where the nest is read, before any replica waits on it.
    """
    names = _own_state(value, kind, read)
    if not names:
        return
    plain = "dict" if isinstance(value, Mapping) else "list" if isinstance(value, list) else "tuple"
    what = f"{plain} subclass" if isinstance(value, list | tuple | dict) else "mapping type"
    listed = ", ".join(names[:8]) + (", ..." if len(names) > 8 else "")
    if isinstance(value, ChainMap):
        detail = (
            f"a ChainMap of {len(value.maps)} maps, which asyncreplica would rebuild as "
            "one map (its maps attribute)"
        )
    else:
        detail = f"attributes: {listed}"
    raise TypeError(
        f"{where} holds a {_type_name(kind)} that carries state of its own besides its "
        f"items ({detail}). asyncreplica rebuilds a {what} from its items alone "
        f"({'type(m)(items)' if plain == 'dict' else 'type(s)(items)'}), so that state "
        "would come back as the constructor sets it and whatever is computed from it "
        f"would be silently wrong. Pass a plain {plain} ({plain}(...)) and keep the state "
        "beside it, or register the type as a pytree node with the state as its "
        "metadata (jax.tree_util.register_pytree_node or register_dataclass)"
    )


def _too_deep(where: str) -> str:
    return (
        f"{where} is a nest more than {MAX_NEST_DEPTH} containers (lists, tuples, "
        f"mappings) deep, or a container that contains itself: asyncreplica traverses "
        f"nests up to MAX_NEST_DEPTH = {MAX_NEST_DEPTH} levels. Pass deep data as one "
        "leaf (an array, or an object of your own class), not as nested containers"
    )


def unflatten(treedef: TreeDef, leaves: Sequence[object]) -> object:
    """Rebuild a structure from a treedef and its leaves (the inverse of :func:`flatten`).

    Args:
        treedef: The treedef returned by :func:`flatten`.
        leaves: As many leaves as the treedef has, in flattening order.

    Returns:
        The rebuilt structure, with the original container types.
    """
    it = iter(leaves)
    return _unflatten_from(treedef, it)


def _build(cls: type, keys: object, children: list[object]) -> object:
    if isinstance(keys, Node):
        try:
            return keys.build(children)
        except Exception as error:
            raise TypeError(_not_rebuilt(cls, "its registered node", error)) from error
    if keys is None:
        if cls is list:
            return children
        if cls is tuple:
            return tuple(children)
        # A namedtuple is rebuilt with its _make (its constructor takes fields).
        named: Callable[[list[object]], object] | None = (
            getattr(cls, "_make", None) if hasattr(cls, "_fields") else None
        )
        how = "type(s)(items)" if named is None else "type(t)._make(items)"
        try:
            rebuilt = cls(children) if named is None else named(children)
        except Exception as error:
            raise TypeError(_not_rebuilt(cls, how, error)) from error
        if type(rebuilt) is not cls or not _holds_items(rebuilt, children):
            raise TypeError(_changed(cls, how, rebuilt, len(children)))
        return rebuilt
    assert isinstance(keys, tuple)
    ordered, insertion, factory = keys
    items = dict(zip(ordered, children, strict=True))
    if len(items) != len(ordered):
        raise TypeError(
            f"the mapping type {_type_name(cls)} could not be rebuilt: its iteration "
            f"yielded the same key more than once ({ordered!r:.200}), and asyncreplica "
            "traverses a mapping by the keys its iteration yields; make its __iter__ yield "
            "each key once, or pass a plain dict (dict(m))"
        )
    if insertion.keys is not None:
        items = {k: items[k] for k in insertion.keys}
    if cls is dict:
        return items
    make: Callable[..., object] = cls
    try:
        rebuilt = make(factory, items) if issubclass(cls, defaultdict) else make(items)
    except Exception as error:
        raise TypeError(_not_rebuilt(cls, "type(m)(items)", error)) from error
    if type(rebuilt) is not cls or not _holds(rebuilt, items):
        raise TypeError(_changed(cls, "type(m)(items)", rebuilt, len(items)))
    return rebuilt


def _holds_items(sequence: object, items: list[object]) -> bool:
    """Whether ``sequence`` (a rebuilt list or tuple) holds exactly ``items``, in order.

    Each the very object given: a constructor that takes its items another way (a
    ``tuple`` subclass whose ``__new__`` takes ``*items`` holds one item, the list) or
    converts them does not. Read by iterating, as flattening reads it.
    """
    if not isinstance(sequence, list | tuple) or len(sequence) != len(items):
        return False
    try:
        return all(got is item for got, item in zip(sequence, items, strict=True))
    except ValueError:  # an __iter__ that disagrees with __len__
        return False


def _holds(mapping: object, items: dict[object, object]) -> bool:
    """Whether ``mapping`` (a rebuilt Mapping) holds exactly ``items``.

    The same keys, each with the very object given. A constructor that drops, adds or
    converts items, or a ``__getitem__`` that gives other objects back, does not.
    """
    if not isinstance(mapping, Mapping):
        return False
    try:
        if len(mapping) != len(items):
            return False
        for key, value in items.items():
            if key not in mapping or mapping[key] is not value:
                return False
    except Exception:
        return False  # a user's mapping that cannot be read back: not rebuilt
    return True


def _type_name(cls: type) -> str:
    module = cls.__module__
    return cls.__qualname__ if module == "builtins" else f"{module}.{cls.__qualname__}"


def _not_rebuilt(cls: type, how: str, error: Exception) -> str:
    """The message for a user's container type whose constructor refused its items."""
    name = _type_name(cls)
    return (
        f"the container type {name} could not be rebuilt as {how} "
        f"({type(error).__name__}: {error}). asyncreplica rebuilds every mapping of a "
        "collective's value, a run's arguments and results, and a dataset element as "
        "type(m)(items), with items a dict (a defaultdict as type(m)(default_factory, "
        "items)), and a list or tuple subclass as type(s)(items) (a namedtuple with "
        f"_make(items)): give {cls.__qualname__} a constructor that takes its items that "
        "way, or pass a plain dict (dict(m)) or list"
    )


def _changed(cls: type, how: str, rebuilt: object, count: int) -> str:
    """The message for a user's container type that did not give back exactly its items.

    Its constructor accepted the items but did not return a container of that type
    holding exactly them (each the very object given): the structure, or a value, would
    change silently (a ``tuple`` subclass whose ``__new__`` takes ``*items`` gains a
    nesting level on every pass).
    """
    name = cls.__qualname__
    try:
        size = f" of length {len(rebuilt)}"  # type: ignore[arg-type]
    except Exception:
        size = ""
    items = "1 item" if count == 1 else f"{count} items"
    if issubclass(cls, Mapping):
        held = "those keys, each with the very value given"
        why = "ignores or converts the dict it is given, or its __getitem__ gives other objects"
        fix = f"give {name} a constructor that keeps the dict it is given, or pass a plain dict (dict(m))"
    else:
        held = "those items, in order, each the very object given"
        why = f"takes its items another way ({name}(*items), say) or converts them"
        plain, make = (
            ("list", "__init__(self, items)")
            if issubclass(cls, list)
            else ("tuple", "__new__(cls, items)")
        )
        fix = (
            f"make {name} a namedtuple (rebuilt with _make), give it a constructor that "
            f"takes one iterable of items and keeps them (def {make}), or pass a plain "
            f"{plain} ({plain}(s))"
        )
    return (
        f"the container type {_type_name(cls)} could not be rebuilt as {how}: given "
        f"{items}, it returned a {_type_name(type(rebuilt))}{size}, not a {name} holding "
        f"{held} (its constructor {why}). asyncreplica rebuilds a collective's value, a "
        "run's arguments and results and a dataset element so, and refuses a rebuild "
        f"that would silently change their structure or values: {fix}"
    )


def _unflatten_from(treedef: TreeDef, it: Iterator[object]) -> object:
    if treedef is None:
        return next(it)
    cls, keys, children = treedef
    return _build(cls, keys, [_unflatten_from(child, it) for child in children])


def map_structure(fn: Callable[[object], object], value: object) -> object:
    """Apply ``fn`` to every leaf of ``value`` and rebuild the structure."""
    leaves, treedef = flatten(value)
    return unflatten(treedef, [fn(leaf) for leaf in leaves])


def treedef_key(treedef: TreeDef) -> object:
    """``treedef`` as plain (JSON-able) data that is equal exactly when treedefs are ``==``.

    For comparing the structures of other processes' collectives (MPI): each node is
    ``[container type's module.qualname, its aux data, children]``; a mapping's
    :class:`KeyOrder`, which treedefs never compare, is left out.
    """
    if treedef is None:
        return None
    kind, aux, children = treedef
    return [
        f"{kind.__module__}.{kind.__qualname__}",
        _aux_key(aux),
        [treedef_key(child) for child in children],
    ]


def _aux_key(aux: object) -> object:
    if isinstance(aux, KeyOrder):
        return None  # never compared (see KeyOrder)
    if isinstance(aux, tuple):
        return [_aux_key(item) for item in aux]
    if aux is None or isinstance(aux, str | int | float):
        return aux
    return repr(aux)


def treedef_str(treedef: TreeDef, leaves: Iterator[str] | None = None) -> str:
    """Describe a treedef for people: ``"[*, *]"``, ``"{'a': *, 'b': (*,)}"``.

    Args:
        treedef: The structure to describe.
        leaves: Optional text for each leaf, in flattening order; ``*`` otherwise.
    """
    if treedef is None:
        return "*" if leaves is None else next(leaves, "?")
    cls, keys, children = treedef
    parts = [treedef_str(c, leaves) for c in children]
    if isinstance(keys, Node):
        return f"{keys.label}({', '.join(parts)})"
    if keys is None:
        if cls is list:
            return "[" + ", ".join(parts) + "]"
        inner = ", ".join(parts) + ("," if len(parts) == 1 else "")
        prefix = "" if cls is tuple else cls.__name__
        return f"{prefix}({inner})"
    assert isinstance(keys, tuple)
    ordered = keys[0]
    body = ", ".join(f"{k!r}: {p}" for k, p in zip(ordered, parts, strict=True))
    prefix = "" if cls is dict else cls.__name__
    return f"{prefix}{{{body}}}"


def regroup(
    values: Sequence[object],
    wrap: Callable[[tuple[object, ...]], object],
    first_replica: int = 0,
) -> object:
    """Merge one structure per replica into one structure, as TensorFlow's ``regroup``.

    Every replica's structure must equal the others' by the one rule that collectives
    use too: their treedefs are ``==`` (same container types, lengths and keys; a
    mapping's key order aside). The result is rebuilt as replica 0's structure. At a
    leaf, if every replica holds the *same object* (``is``), that object is returned
    unwrapped; otherwise ``wrap(values)`` (a ``PerReplica``) is returned.

    Args:
        values: One structure per replica, in replica order.
        wrap: Builds the per-replica value for a leaf that differs.
        first_replica: The global id of ``values[0]``'s replica (under MPI, this
            process's first replica), for the error message.

    Returns:
        The merged structure.

    Raises:
        ValueError: The replicas' structures differ (naming the first replica whose
            structure differs from ``values[0]``'s), or a value is more than
            :data:`MAX_NEST_DEPTH` containers deep.
    """
    flat = [flatten(v, None, f"replica {first_replica + i}'s value") for i, v in enumerate(values)]
    leaves0, treedef0 = flat[0]
    for i, (_, treedef) in enumerate(flat):
        if treedef != treedef0:
            message = structure_message(
                treedef_str(treedef0), first_replica, treedef_str(treedef), first_replica + i
            )
            hint = self_unequal_hint((treedef0, treedef))
            raise ValueError(f"{message}. {hint}" if hint else message)
    merged: list[object] = []
    for j, leaf0 in enumerate(leaves0):
        column = tuple(leaves[j] for leaves, _ in flat)
        merged.append(leaf0 if all(v is leaf0 for v in column) else wrap(column))
    return unflatten(treedef0, merged)


def self_unequal_keys(treedef: TreeDef) -> list[object]:
    """The mapping keys in ``treedef`` that compare unequal to themselves (``nan``).

    Asked only when structures were found to differ (an error path): such a key makes
    two replicas' structures differ while their descriptions read the same.
    """
    found: list[object] = []
    stack: list[TreeDef] = [treedef]
    while stack:
        node = stack.pop()
        if node is None:
            continue
        _, keys, children = node
        if isinstance(keys, tuple):
            ordered = keys[0]
            if isinstance(ordered, tuple):
                found.extend(k for k in ordered if k != k)
        stack.extend(children)
    return found


def self_unequal_hint(treedefs: Iterable[TreeDef]) -> str:
    """A sentence for a structure mismatch caused by keys unequal to themselves, or ``""``."""
    for treedef in treedefs:
        keys = self_unequal_keys(treedef)
        if keys:
            return (
                f"A mapping key compares unequal to itself ({keys[0]!r}, as float('nan') "
                "does), so one replica's key never equals another's and the structures "
                "cannot match, however alike they look. Use keys that equal themselves "
                "(strings or ints), e.g. str(key)."
            )
    return ""


def structure_message(first: str, first_replica: int, other: str, replica: int) -> str:
    """``regroup``'s error text: replica ``replica``'s structure differs from the first's.

    ``first`` and ``other`` are :func:`treedef_str` texts (under MPI, processes compare
    their first replicas' structures with it, as one process compares its replicas').
    """
    return (
        f"replicas returned values of different structure: replica {first_replica} gave "
        f"{first} but replica {replica} gave {other}; "
        "every replica must return the same structure (same containers, lengths and keys)"
    )


def select_replica(
    replica_id: int,
    structure: object,
    component: Callable[[int, object], object],
) -> object:
    """Pick replica ``replica_id``'s part of a structure, as TensorFlow's ``select_replica``.

    Args:
        replica_id: The replica whose part to pick.
        structure: A structure whose leaves may be distributed values.
        component: ``component(replica_id, leaf)`` returns the leaf's component for that
            replica, or the leaf itself when it is not distributed.

    Returns:
        A new structure of the same containers; the input is not modified.
    """
    if not is_nest(structure):
        return component(replica_id, structure)
    return map_structure(lambda leaf: component(replica_id, leaf), structure)
