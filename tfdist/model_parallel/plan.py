"""Model-parallel arithmetic: splits, placements, bubble, bytes. Pure Python, no TensorFlow."""

from __future__ import annotations

from tfdist.errors import ConfigError


def even_split(num_items: int, num_parts: int) -> list[int]:
    """Sizes of `num_parts` contiguous groups covering `num_items`, differing by at most one.

    Earlier groups take the remainder, so 5 layers on 2 devices split 3 + 2.

    Raises:
        ConfigError: when there are fewer items than parts, or no parts.
    """
    if num_parts < 1:
        raise ConfigError(f"Need at least one device to split over. Received: {num_parts}.")
    if num_items < num_parts:
        raise ConfigError(f"Cannot split {num_items} item(s) over {num_parts} devices: each "
                          f"device needs at least one. Use --devices {max(num_items, 1)} or fewer.")
    base, extra = divmod(num_items, num_parts)
    return [base + (1 if i < extra else 0) for i in range(num_parts)]


def shard_bounds(total: int, parts: int) -> list[tuple[int, int]]:
    """Pure function: [start, stop) of each of `parts` near-equal shards of `total`
    (earlier ones larger, as `even_split`)."""
    out, start = [], 0
    for size in even_split(total, parts):
        out.append((start, start + size))
        start += size
    return out


def check_tensor_parallel(devices: int, tensor_parallel: int, placement: bool = False) -> int:
    """Pure function: the tensor-parallel degree T, checked against the devices (P stages x T).

    Args:
        devices: Devices to split over (0: not given).
        tensor_parallel: T, devices per stage.
        placement: Whether stages are named by --placement (one device each).

    Raises:
        ConfigError: for T < 1, T > 1 with --placement, or devices not a multiple of T.
    """
    t = int(tensor_parallel)
    if t < 1:
        raise ConfigError(f"--tensor-parallel must be at least 1. Received: {t}.")
    if t == 1:
        return t
    if placement:
        raise ConfigError(f"--tensor-parallel {t} splits each stage over {t} of --devices; "
                          "--placement names one device per layer group. Drop --placement "
                          "(stages are then cut evenly), or use --tensor-parallel 1.")
    if devices < t or devices % t:
        raise ConfigError(f"--tensor-parallel {t} needs --devices P*{t} (P stages of {t} "
                          f"devices each). Received: --devices {devices}. Use --devices {t} "
                          f"(one stage) or {2 * t} (two stages).")
    return t


def bubble_fraction(stages: int, microbatches: int) -> float:
    """GPipe's idle fraction (p - 1) / (m + p - 1) for p balanced stages and m micro-batches."""
    if stages < 1 or microbatches < 1:
        raise ConfigError(f"stages and microbatches must be >= 1. Received: stages={stages}, "
                          f"microbatches={microbatches}.")
    return (stages - 1) / (microbatches + stages - 1)


def ideal_step_ratio(stages: int, microbatches: int) -> float:
    """A balanced pipeline's step over one device's step of the whole model: each of
    P stages does 1/P of the work, busy 1 - `bubble_fraction` of the step, so
    (M + P - 1) / (M P)."""
    return 1 / (stages * (1 - bubble_fraction(stages, microbatches)))


def measured_bubble(step_time_s: float, busy_times_s: list[float]) -> float:
    """Idle fraction of a pipeline step: 1 - (mean busy time of a device) / (step time).

    Args:
        step_time_s: Wall time of one pipelined step.
        busy_times_s: Per stage, the time its device needs alone for the same
            micro-batches (forward and backward), measured separately.
    """
    if step_time_s <= 0 or not busy_times_s:
        raise ValueError(f"Need a positive step time and busy times. Received: {step_time_s}, "
                         f"{busy_times_s}.")
    return 1.0 - (sum(busy_times_s) / len(busy_times_s)) / step_time_s


def microbatch_size(batch_size: int, microbatches: int) -> int:
    """Examples per micro-batch.

    Raises:
        ConfigError: when the batch does not divide into `microbatches` equal parts
            (equal parts keep the accumulated gradient equal to the full batch's).
    """
    if microbatches < 1:
        raise ConfigError(f"--microbatches must be >= 1. Received: {microbatches}.")
    if batch_size % microbatches:
        raise ConfigError(f"global_batch_size={batch_size} is not divisible by "
                          f"microbatches={microbatches}. Pick a --microbatches that divides it, "
                          f"or a --global-batch-size that is a multiple of {microbatches}.")
    return batch_size // microbatches


def parse_placement(spec: str) -> list[tuple[str, list[str]]]:
    """Parses "layer_a,layer_b=/cpu:0;layer_c=/cpu:1" into [(device, [layers]), ...].

    Groups keep their order (for a pipeline, the stage order).

    Raises:
        ConfigError: for an empty group, a missing "=", or a layer named twice.
    """
    groups: list[tuple[str, list[str]]] = []
    seen: set[str] = set()
    for part in (p.strip() for p in spec.split(";")):
        if not part:
            continue
        names, eq, device = part.partition("=")
        layers = [n.strip() for n in names.split(",") if n.strip()]
        if not eq or not device.strip() or not layers:
            raise ConfigError(f"--placement groups look like 'layer_a,layer_b=/cpu:0', separated "
                              f"by ';'. Received group: {part!r}.")
        for name in layers:
            if name in seen:
                raise ConfigError(f"Layer {name!r} is placed twice in --placement {spec!r}.")
            seen.add(name)
        groups.append((device.strip(), layers))
    if not groups:
        raise ConfigError(f"--placement is empty. Received: {spec!r}.")
    return groups


def check_groups_cover(groups: list[tuple[str, list[str]]], layer_names: list[str]) -> None:
    """Checks that `groups` name every layer once, contiguously and in model order.

    Raises:
        ConfigError: naming unknown, missing or out-of-order layers.
    """
    named = [n for _, layers in groups for n in layers]
    unknown = [n for n in named if n not in layer_names]
    if unknown:
        raise ConfigError(f"--placement names layers the model does not have: {unknown}. "
                          f"The model's layers: {layer_names}.")
    missing = [n for n in layer_names if n not in named]
    if missing:
        raise ConfigError(f"--placement leaves layers unplaced: {missing}. Place every layer "
                          f"of {layer_names}.")
    if named != layer_names:
        raise ConfigError(f"--placement must list layers in model order, one contiguous group "
                          f"per stage. Received order {named}; the model's is {layer_names}.")


def attach_weightless(groups: list[tuple[str, list[str]]], layer_names: list[str],
                      weightless: set[str]) -> list[tuple[str, list[str]]]:
    """Pure function: `groups` with every unnamed weightless layer placed beside its neighbour.

    A layer without weights (pooling, dropout, reshape) has nothing to place,
    so it goes with the layer before it (the first stage for leading ones) and
    never needs its own stage or its own `--placement` entry. Layers the
    groups do name stay where they are named.

    Args:
        groups: [(device, [layer names])], in stage order.
        layer_names: Every layer of the model, in model order.
        weightless: The names of the layers that have no weights.

    Returns:
        The groups with the weightless layers inserted, in model order.

    Raises:
        ConfigError: as `check_groups_cover` does for the named layers and
            the layers with weights.
    """
    named = {n for _, layers in groups for n in layers}
    check_groups_cover(groups, [n for n in layer_names if n in named or n not in weightless])
    owner = {n: i for i, (_, layers) in enumerate(groups) for n in layers}
    out: list[tuple[str, list[str]]] = [(device, []) for device, _ in groups]
    current = 0
    for name in layer_names:
        current = owner.get(name, current)
        out[current][1].append(name)
    return out


def device_totals(rows: list[tuple[str, str, int, int]]) -> dict[str, tuple[int, int]]:
    """Per device, (parameters, bytes) summed over (layer, device, params, bytes) rows."""
    totals: dict[str, tuple[int, int]] = {}
    for _, device, params, nbytes in rows:
        p, b = totals.get(device, (0, 0))
        totals[device] = (p + params, b + nbytes)
    return totals


def format_placement(rows: list[tuple[str, str, int, int]]) -> str:
    """The placement table: one row per layer, then parameters and bytes per device."""
    head = ("layer", "device", "params", "bytes")
    body = [(a, b, str(c), str(d)) for a, b, c, d in rows]
    totals = device_totals(rows)
    total_params = sum(p for p, _ in totals.values()) or 1
    tail = [("total", dev, str(p), f"{b} ({100 * p / total_params:.0f}%)")
            for dev, (p, b) in totals.items()]
    widths = [max(len(r[i]) for r in [head, *body, *tail]) for i in range(4)]
    fmt = lambda r: "  ".join(c.ljust(w) if i < 2 else c.rjust(w)  # noqa: E731
                              for i, (c, w) in enumerate(zip(r, widths)))
    line = fmt(head)
    return "\n".join([line, "-" * len(line), *map(fmt, body), "-" * len(line), *map(fmt, tail)])
