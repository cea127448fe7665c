"""The standard partitioners: IID, label skew (Dirichlet, shards, class windows),
quantity skew, and the natural / per-domain splits of data sets that carry a client id.

Every ``split`` returns one sorted int64 array of row indices per client; no row is
given to two clients, and no client is left without rows.
"""
from __future__ import annotations

import numpy as np
import torch
from pydantic import Field

from .arrays import ArrayDataset
from .errors import DataError
from .partition_base import PARTITIONERS, Partitioner, PartitionParams


def class_labels(data: ArrayDataset, partitioner: str) -> np.ndarray:
    """``data.y`` as an int64 vector; label-skew partitioners need integer class labels."""
    y = data.y
    if y.dim() != 1 or y.dtype.is_floating_point or y.dtype == torch.bool:
        raise DataError(
            f"partitioner '{partitioner}' splits by class and needs a 1-d integer label vector, "
            f"got y of dtype {y.dtype} and shape {tuple(y.shape)}; use 'iid' or 'quantity_skew' instead"
        )
    return y.numpy().astype(np.int64)


def group_values(data: ArrayDataset, key: str, partitioner: str) -> np.ndarray:
    """``data.groups[key]`` as a numpy vector, or a DataError naming the groups there are."""
    if key not in data.groups:
        have = ", ".join(sorted(data.groups)) or "none"
        raise DataError(
            f"partitioner '{partitioner}' needs the group '{key}' in the data set, "
            f"but it only has these groups: {have}; set key=<one of them>"
        )
    return data.groups[key].numpy()


def check_num_clients(num_clients: int, num_rows: int) -> None:
    """A DataError unless 1 <= ``num_clients`` <= ``num_rows`` (every client needs a row)."""
    if num_clients < 1:
        raise DataError(f"num_clients must be at least 1, got {num_clients}")
    if num_clients > num_rows:
        raise DataError(
            f"cannot give {num_clients} clients at least one row each from {num_rows} rows; "
            f"use num_clients <= {num_rows}"
        )


def finish(parts: list[list[np.ndarray]], fix: str) -> list[np.ndarray]:
    """Concatenate and sort each client's index chunks; every client must get a row."""
    out = [np.sort(np.concatenate(chunks)).astype(np.int64) if chunks else np.empty(0, np.int64) for chunks in parts]
    empty = [i for i, rows in enumerate(out) if len(rows) == 0]
    if empty:
        raise DataError(f"clients {empty} received no rows; {fix}")
    return out


def deal_evenly(
    rows: np.ndarray, holders: list[int], parts: list[list[np.ndarray]], rng: np.random.Generator, what: str
) -> None:
    """Shuffle ``rows`` and deal them into ``len(holders)`` near-equal chunks, one per holder."""
    if len(rows) < len(holders):
        raise DataError(
            f"{what} has {len(rows)} rows but {len(holders)} clients must share it; "
            "use fewer clients or give each client fewer classes"
        )
    for client, chunk in zip(holders, np.array_split(rng.permutation(rows), len(holders))):
        parts[client].append(chunk)


class IIDParams(PartitionParams):
    """The IID partitioner takes no parameters."""
    pass


@PARTITIONERS.register("iid", "uniform random split into near-equal client shares")
class IIDPartitioner(Partitioner):
    """Shuffle all rows and cut them into ``num_clients`` shares whose sizes differ by at most one."""

    Params = IIDParams

    def split(self, data: ArrayDataset, num_clients: int, rng: np.random.Generator) -> list[np.ndarray]:
        """A random permutation of the rows cut into ``num_clients`` near-equal shares."""
        check_num_clients(num_clients, len(data))
        shares = np.array_split(rng.permutation(len(data)), num_clients)
        return finish([[rows] for rows in shares], "use fewer clients")


class DirichletParams(PartitionParams):
    """Settings of the Dirichlet label skew: alpha and the minimum client size with its redraw limit."""

    alpha: float = Field(0.5, gt=0, description="Dirichlet concentration; small = strong label skew")
    min_size: int = Field(10, ge=1, description="redraw until every client has at least this many rows")
    max_retries: int = Field(100, ge=1, description="draws before giving up on min_size")


@PARTITIONERS.register("dirichlet", "label skew: each class spread over clients with Dir(alpha) proportions")
class DirichletPartitioner(Partitioner):
    """Label skew of Hsu et al. 2019 ("Measuring the effects of non-identical data
    distribution"): for each class c, proportions p_c ~ Dir(alpha * 1_K) over the K clients,
    and client k receives a fraction p_c[k] of the rows of class c.

    The whole draw is repeated while some client has fewer than ``min_size`` rows, at most
    ``max_retries`` times.
    """

    Params = DirichletParams
    params: DirichletParams

    def split(self, data: ArrayDataset, num_clients: int, rng: np.random.Generator) -> list[np.ndarray]:
        """Per class, Dir(alpha) shares of its rows over the
        clients; redrawn until every client has ``min_size`` rows."""
        labels = class_labels(data, "dirichlet")
        check_num_clients(num_clients, len(labels))
        p = self.params
        if num_clients * p.min_size > len(labels):
            raise DataError(
                f"dirichlet: {num_clients} clients x min_size {p.min_size} needs {num_clients * p.min_size} rows, "
                f"the data set has {len(labels)}; lower min_size or use fewer clients"
            )
        by_class = [np.flatnonzero(labels == c) for c in np.unique(labels)]
        smallest = 0
        for _ in range(p.max_retries):
            parts = self._draw(by_class, num_clients, rng)
            sizes = [sum(len(chunk) for chunk in chunks) for chunks in parts]
            if min(sizes) >= p.min_size:
                return finish(parts, "lower min_size")
            smallest = max(smallest, min(sizes))
        raise DataError(
            f"dirichlet: in {p.max_retries} draws with alpha={p.alpha} no partition gave every one of "
            f"{num_clients} clients at least min_size={p.min_size} rows (best smallest client: {smallest}); "
            "lower min_size or raise alpha"
        )

    def _draw(self, by_class: list[np.ndarray], num_clients: int, rng: np.random.Generator) -> list[list[np.ndarray]]:
        parts: list[list[np.ndarray]] = [[] for _ in range(num_clients)]
        for rows in by_class:
            share = rng.dirichlet(np.full(num_clients, self.params.alpha))
            cuts = (np.cumsum(share)[:-1] * len(rows)).astype(np.int64)
            for client, chunk in enumerate(np.split(rng.permutation(rows), cuts)):
                parts[client].append(chunk)
        return parts


class ShardsParams(PartitionParams):
    """Settings of the shards split: the number of distinct classes per client."""

    classes_per_client: int = Field(2, ge=1, description="distinct classes each client holds")


@PARTITIONERS.register("shards", "pathological label skew: each client holds k distinct classes")
class ShardsPartitioner(Partitioner):
    """Pathological non-IID split in the spirit of McMahan et al. 2017: every client holds
    exactly ``classes_per_client`` distinct classes.

    Clients pick their classes in turn, always the least-used classes so far (ties broken
    at random), so class usage counts differ by at most one. The rows of a class are dealt
    evenly among the clients that hold it. When ``num_clients * classes_per_client`` is
    smaller than the number of classes, the rows of classes nobody holds stay unused.
    """

    Params = ShardsParams
    params: ShardsParams

    def split(self, data: ArrayDataset, num_clients: int, rng: np.random.Generator) -> list[np.ndarray]:
        """Each client takes its ``classes_per_client`` least-used
        classes; a class's rows are dealt among its holders."""
        labels = class_labels(data, "shards")
        check_num_clients(num_clients, len(labels))
        classes = np.unique(labels)
        k = self.params.classes_per_client
        if k > len(classes):
            raise DataError(
                f"shards: classes_per_client={k} but the data set has only {len(classes)} classes; "
                f"use classes_per_client <= {len(classes)}"
            )
        usage = np.zeros(len(classes), dtype=np.int64)
        holders: list[list[int]] = [[] for _ in classes]
        for client in range(num_clients):
            for c in np.lexsort((rng.random(len(classes)), usage))[:k]:
                holders[c].append(client)
                usage[c] += 1
        parts: list[list[np.ndarray]] = [[] for _ in range(num_clients)]
        for c, owners in zip(classes, holders):
            if owners:
                deal_evenly(np.flatnonzero(labels == c), owners, parts, rng, f"class {c}")
        return finish(parts, "use fewer clients")


class QuantitySkewParams(PartitionParams):
    """Settings of the quantity skew: alpha of the client sizes and the rows every client gets first."""

    alpha: float = Field(1.0, gt=0, description="Dirichlet concentration of client sizes; small = very unequal")
    min_size: int = Field(10, ge=1, description="rows every client gets before the skewed remainder")


@PARTITIONERS.register("quantity_skew", "IID labels, client sizes skewed by Dir(alpha)")
class QuantitySkewPartitioner(Partitioner):
    """Quantity skew (Li et al. 2022, NIID-Bench, "quantity-based skew"): rows are
    shuffled, so labels stay IID, but client sizes follow q ~ Dir(alpha * 1_K).

    Each client first gets ``min_size`` rows; the remaining R rows are shared out as
    Multinomial(R, q), so ``min_size`` holds without redraws and every row is used.
    """

    Params = QuantitySkewParams
    params: QuantitySkewParams

    def split(self, data: ArrayDataset, num_clients: int, rng: np.random.Generator) -> list[np.ndarray]:
        """Shuffled rows cut into sizes ``min_size`` + Multinomial(R, q), q ~ Dir(alpha)."""
        n = len(data)
        check_num_clients(num_clients, n)
        floor = self.params.min_size
        if num_clients * floor > n:
            raise DataError(
                f"quantity_skew: {num_clients} clients x min_size {floor} needs {num_clients * floor} rows, "
                f"the data set has {n}; lower min_size or use fewer clients"
            )
        q = rng.dirichlet(np.full(num_clients, self.params.alpha))
        sizes = floor + rng.multinomial(n - num_clients * floor, q)
        shares = np.split(rng.permutation(n), np.cumsum(sizes)[:-1])
        return finish([[rows] for rows in shares], "use fewer clients")


class NaturalParams(PartitionParams):
    """Settings of the natural split: the group holding the client id."""

    key: str = Field("client", min_length=1, description="group that holds the natural client id")


@PARTITIONERS.register("natural", "one client per value of a natural group (device, school, silo)")
class NaturalPartitioner(Partitioner):
    """Client i holds the rows whose ``groups[key]`` equals the i-th smallest group value."""

    Params = NaturalParams
    params: NaturalParams

    def split(self, data: ArrayDataset, num_clients: int, rng: np.random.Generator) -> list[np.ndarray]:
        """One client per distinct ``groups[key]`` value, in sorted order; ``num_clients`` must equal their number."""
        key = self.params.key
        values = group_values(data, key, "natural")
        distinct = np.unique(values)
        if num_clients != len(distinct):
            raise DataError(
                f"natural: the data set has {len(distinct)} distinct '{key}' groups, one client each, "
                f"but num_clients={num_clients}; set num_clients={len(distinct)}"
            )
        return finish([[np.flatnonzero(values == v)] for v in distinct], "every group needs a row")


class DomainParams(PartitionParams):
    """Settings of the domain split: the domain group and, optionally, the clients of each domain."""

    key: str = Field("domain", min_length=1, description="group that holds the domain id")
    clients_per_domain: list[int] | None = Field(
        None,
        description="clients of each domain in sorted domain order (sums to num_clients); "
        "default: spread evenly",
    )


@PARTITIONERS.register("domain", "clients spread evenly (or as clients_per_domain says) over domains, IID within each")
class DomainPartitioner(Partitioner):
    """Feature-skew split of FedBN / Split-Mix: every client lives in one domain.

    Domains (sorted by id) get ``num_clients // D`` clients each and the first
    ``num_clients % D`` domains one more, unless ``clients_per_domain`` gives each domain's
    count (FADE's Adult fairness setting, §6.1: ``key="sex"``, ``[1, m]`` = one female user
    and m male users). Clients are numbered domain by domain, and the rows of a domain are
    split IID into near-equal shares among its clients.
    """

    Params = DomainParams
    params: DomainParams

    def split(self, data: ArrayDataset, num_clients: int, rng: np.random.Generator) -> list[np.ndarray]:
        """Clients numbered domain by domain, each domain's rows dealt IID among its clients."""
        key = self.params.key
        values = group_values(data, key, "domain")
        check_num_clients(num_clients, len(values))
        domains = np.unique(values)
        counts = self._counts(domains, num_clients)
        parts: list[list[np.ndarray]] = [[] for _ in range(num_clients)]
        first = 0
        for domain, count in zip(domains, counts):
            owners = list(range(first, first + count))
            deal_evenly(np.flatnonzero(values == domain), owners, parts, rng, f"domain {key}={domain}")
            first += count
        return finish(parts, "use fewer clients")

    def _counts(self, domains: np.ndarray, num_clients: int) -> list[int]:
        """Clients per domain: the configured ``clients_per_domain``, checked, or an even spread."""
        given, key, d = self.params.clients_per_domain, self.params.key, len(domains)
        if given is None:
            if num_clients < d:
                raise DataError(
                    f"domain: {d} domains need at least one client each, got num_clients={num_clients}; "
                    f"use num_clients >= {d}"
                )
            return [num_clients // d + (i < num_clients % d) for i in range(d)]
        ids = ", ".join(str(v) for v in domains.tolist())
        if len(given) != d:
            raise DataError(
                f"domain: clients_per_domain has {len(given)} entries but '{key}' has {d} domains ({ids}); "
                f"give one count per domain in that order"
            )
        if min(given) < 1:
            raise DataError(
                f"domain: clients_per_domain={given} gives a domain no client; every domain ({ids}) needs >= 1"
            )
        if sum(given) != num_clients:
            raise DataError(
                f"domain: clients_per_domain={given} sums to {sum(given)} but num_clients={num_clients}; "
                f"set num_clients={sum(given)}"
            )
        return list(given)


class ClassWindowParams(PartitionParams):
    """Settings of FADE's class windows: window, stride, all-class source clients and the source / target domains."""

    window: int = Field(2, ge=1, description="consecutive classes per target client")
    stride: int = Field(1, ge=1, description="shift of the window from one target client to the next")
    source_clients: int = Field(0, ge=0, description="clients 0..source_clients-1 hold every class")
    source_domain: int | None = Field(
        None, description="if set, rows of this domain go to the source clients only, all other rows to targets"
    )
    target_domain: int | None = Field(
        None, description="with source_domain: only rows of this domain go to the targets (other domains unused)"
    )
    domain_key: str = Field("domain", min_length=1, description="group holding the domain id (with source_domain)")


@PARTITIONERS.register("class_window", "FADE strided class windows (+ optional all-class source clients)")
class ClassWindowPartitioner(Partitioner):
    """Non-IID target users of FADE (Hong et al. 2021, §5.2): target client u holds the
    classes {(u * stride + j) mod C : j < window}, e.g. Office window 20, stride 10.

    Clients ``0..source_clients-1`` are source users holding all C classes; target clients
    follow. Each class's rows are dealt evenly among the clients holding it. With
    ``source_domain`` set (FADE's UDA setting), rows of that domain are split IID among the
    source clients and the windows apply to the remaining (target-domain) rows, or with
    ``target_domain`` also set to that domain's rows only (a many-domain data set gives one
    source -> target task, rows of the other domains unused). Classes are
    the sorted distinct labels; rows of a class no client holds stay unused.
    """

    Params = ClassWindowParams
    params: ClassWindowParams

    def split(self, data: ArrayDataset, num_clients: int, rng: np.random.Generator) -> list[np.ndarray]:
        """Source clients take all classes (or the source domain's
        rows); target client u the window of classes from u * stride."""
        p = self.params
        labels = class_labels(data, "class_window")
        check_num_clients(num_clients, len(labels))
        sources = list(range(p.source_clients))
        targets = list(range(p.source_clients, num_clients))
        if not targets:
            raise DataError(
                f"class_window: source_clients={p.source_clients} leaves no target client among "
                f"num_clients={num_clients}; use num_clients > source_clients"
            )
        on_target = np.ones(len(labels), dtype=bool)
        parts: list[list[np.ndarray]] = [[] for _ in range(num_clients)]
        if p.target_domain is not None and p.source_domain is None:
            raise DataError("class_window: target_domain needs source_domain (the domain of the source clients)")
        if p.source_domain is not None:
            if not sources:
                raise DataError("class_window: source_domain needs source_clients >= 1 to hold its rows")
            domains = group_values(data, p.domain_key, "class_window")
            on_source = domains == p.source_domain
            if not on_source.any():
                raise DataError(f"class_window: no row has {p.domain_key} == source_domain={p.source_domain}")
            on_target = ~on_source if p.target_domain is None else domains == p.target_domain
            if p.target_domain is None and not on_target.any():
                raise DataError(
                    f"class_window: every row has {p.domain_key} == source_domain={p.source_domain}; "
                    "the target clients would get nothing"
                )
            if p.target_domain == p.source_domain or not on_target.any():
                raise DataError(
                    f"class_window: target_domain={p.target_domain} must be another domain with rows "
                    f"(domains: {', '.join(str(d) for d in np.unique(domains).tolist())})"
                )
            deal_evenly(np.flatnonzero(on_source), sources, parts, rng, f"source domain {p.source_domain}")
            sources = []
        classes = np.unique(labels[on_target])
        if p.window > len(classes):
            raise DataError(
                f"class_window: window={p.window} but the target rows have only {len(classes)} classes; "
                f"use window <= {len(classes)}"
            )
        holders: list[list[int]] = [list(sources) for _ in classes]
        for u, client in enumerate(targets):
            for j in range(p.window):
                holders[(u * p.stride + j) % len(classes)].append(client)
        for c, owners in zip(classes, holders):
            if owners:
                deal_evenly(np.flatnonzero(on_target & (labels == c)), owners, parts, rng, f"class {c}")
        return finish(parts, "use fewer clients")
