"""Grid, loop, imap, fmap and omap candidates for a graph-defined op (docs/design.md §6.3).

Mirage's defaults, adapted to index labels (:mod:`search.labels`): a grid axis
walks one index class — every input that has that class splits it, the others
replicate — with a size that cuts the dim into tiles of ``config.tile_sizes``
(or into single rows when the dim is at most ``config.full_split_max`` long, a
batch/row axis); the loop walks one class with a range from
``config.forloop_ranges``. Choosing (class, size) per axis instead of a free
imap per input removes mappings in which two inputs split different indices along
one grid axis — a block would then combine elements that never meet in the
program. Grid axes are ordered by class so that swapping x and y is not generated
twice. Tiles of all inputs must fit shared memory together (they are all live
when the last iterator is created).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Iterator, Optional, Sequence

from . import labels as lb
from .config import SearchConfig


@dataclass(frozen=True)
class Mapping:
    grid: tuple[int, int, int]
    forloop: int
    imaps: tuple[tuple, ...]
    fmaps: tuple[Optional[int], ...]
    axis_classes: tuple[Optional[int], ...]
    tiles: tuple[tuple[int, ...], ...]
    tile_labels: tuple[lb.Labels, ...]

    def key(self) -> tuple:
        return (self.grid, self.forloop, self.imaps, tuple(-1 if f is None else f for f in self.fmaps))


def _majors(lab: lb.Labels, shape: tuple) -> list[tuple[int, int, int]]:
    """(dim, class, major size) for every labelled dim of size > 1."""
    return [(d, l[0][0], l[0][1]) for d, (l, s) in enumerate(zip(lab, shape)) if s > 1 and l]


def axis_options(inputs: Sequence[tuple[tuple, lb.Labels]], cfg: SearchConfig) -> list[tuple[int, int]]:
    """(class, grid size) pairs a grid axis may take."""
    sizes: dict[int, set[int]] = {}
    for shape, lab in inputs:
        for d, c, s in _majors(lab, shape):
            gs = sizes.setdefault(c, set())
            gs.update(s // t for t in cfg.tile_sizes if s % t == 0 and s // t > 1)
            if 1 < s <= cfg.full_split_max:
                gs.add(s)
    out = []
    for c in sorted(sizes):
        for g in sorted(sizes[c]):
            if all(s % g == 0 for shape, lab in inputs for d, cc, s in _majors(lab, shape) if cc == c):
                out.append((c, g))
    return out


def _choices(dims: list[int]) -> list[Optional[int]]:
    return dims if dims else [None]


def mappings(inputs: Sequence[tuple[tuple, lb.Labels]], itemsize: int, cfg: SearchConfig,
             reduced: frozenset | None = None) -> Iterator[Mapping]:
    """All mappings for a graph-defined op over ``inputs`` (shape, labels), in a fixed order."""
    opts = axis_options(inputs, cfg)
    grids: list[tuple[tuple[int, int], ...]] = [()]
    for n in range(1, cfg.max_grid_axes + 1):
        for combo in itertools.combinations(opts, n):
            if len({c for c, _ in combo}) == n:
                grids.append(combo)
    for axes in grids:
        blocks = 1
        for _, g in axes:
            blocks *= g
        if not cfg.min_blocks <= blocks <= cfg.max_blocks:
            continue
        grid = tuple(g for _, g in axes) + (1,) * (3 - len(axes))
        # per input: the dims each axis may split
        per_input = []
        for shape, lab in inputs:
            opts_i = []
            for c, g in axes:
                opts_i.append(_choices([d for d, cc, s in _majors(lab, shape) if cc == c]))
            per_input.append(list(itertools.product(*opts_i)) if axes else [()])
        for imap_choice in itertools.product(*per_input):
            split = _apply_imaps(inputs, axes, imap_choice)
            if split is None:
                continue
            shapes, labs = split
            yield from _loops(inputs, grid, axes, imap_choice, shapes, labs, itemsize, cfg, reduced)


def _apply_imaps(inputs, axes, imap_choice):
    shapes, labs = [], []
    for (shape, lab), dims in zip(inputs, imap_choice):
        shape, lab = list(shape), list(lab)
        if len(set(d for d in dims if d is not None)) < len([d for d in dims if d is not None]):
            return None
        for (c, g), d in zip(axes, dims):
            if d is None:
                continue
            r = lb.split(lab[d], g)
            if r is None or shape[d] % g:
                return None
            shape[d] //= g
            lab[d] = r[1]
        shapes.append(tuple(shape))
        labs.append(tuple(lab))
    return shapes, labs


#: how far past ``config.forloop_ranges``'s largest range a loop may go, in doublings, for a
#: class whose tiles fit shared memory at none of the listed ranges
MAX_LOOP_DOUBLINGS = 4


def _loops(inputs, grid, axes, imap_choice, shapes, labs, itemsize, cfg, reduced):
    """The mappings of one grid choice: no loop, or a loop of each listed range over each
    class the inputs have (one the program reduces, when ``reduced`` is given). A class
    whose tiles fit shared memory at none of the listed ranges — a 32k-key row at head dim
    128: 512 keys a step of 64 hold 256 KB of K and V — gets the first doubling of the
    largest range (up to :data:`MAX_LOOP_DOUBLINGS`) at which they fit, so long rows still
    have a loop (which the split-loop rewrite then spreads over blocks)."""
    imaps = tuple(tuple(list(dims) + [None] * (3 - len(dims))) for dims in imap_choice)
    classes = tuple([c for c, _ in axes] + [None] * (3 - len(axes)))
    yield from _loop_mappings(1, None, grid, imaps, classes, shapes, labs, itemsize, cfg)
    present = sorted({c for sh, lab in zip(shapes, labs) for _, c, _ in _majors(lab, sh)})
    for c in present:
        if reduced is not None and c not in reduced:
            continue  # accumulators sum over the loop: it must walk a class the program reduces
        fitted = False
        sizes = {sh[d] for sh, lab in zip(shapes, labs) for d, cc, _ in _majors(lab, sh) if cc == c}
        for F in (loop_ranges(sizes.pop(), cfg.forloop_ranges) if len(sizes) == 1 else cfg.forloop_ranges):
            for m in _loop_mappings(F, c, grid, imaps, classes, shapes, labs, itemsize, cfg):
                fitted = True
                yield m
        longest = max(cfg.forloop_ranges, default=0)
        for k in range(1, MAX_LOOP_DOUBLINGS + 1 if longest and not fitted else 1):
            found = list(_loop_mappings(longest << k, c, grid, imaps, classes, shapes, labs, itemsize, cfg))
            yield from found
            if found:
                break


#: loop steps :func:`loop_ranges` may pick, as powers of two: 16 … 1024 elements
POW2_STEPS = tuple(1 << j for j in range(4, 11))


def loop_ranges(size: int, listed: Sequence[int]) -> list[int]:
    """The loop ranges offered for a dim of ``size`` elements: ``listed``
    (``config.forloop_ranges``), each one whose step ``size / F`` is not a power of two
    replaced by the nearest range (in ratio, not used yet) whose step is one — from
    :data:`POW2_STEPS` — where such a range exists.

    Why: Triton's register tiles have power-of-two extents, so a step of 296 elements
    (18,944 / 64) is padded to 512 with its last 216 lanes masked, and its loads start at
    offsets that are not a multiple of 128 bytes; 18,944 / 74 steps of 256 load the same
    bytes in full, aligned tiles. A dim that is a power of two keeps ``listed`` as it is."""
    steps = [size // t for t in POW2_STEPS if size % t == 0 and size // t > 1]
    out: list[int] = []
    for F in listed:
        pick = F
        if not (size % F == 0 and _is_pow2(size // F)):
            free = [f for f in steps if f not in out]
            if free:
                pick = min(free, key=lambda f: max(f, F) / min(f, F))
        if pick not in out:
            out.append(pick)
    return out


def _is_pow2(n: int) -> bool:
    return n > 0 and n & (n - 1) == 0


def _loop_mappings(F, c, grid, imaps, classes, shapes, labs, itemsize, cfg):
    """The mappings with a loop of ``F`` steps over class ``c`` (``F == 1``: no loop) whose
    tiles fit shared memory together."""
    if F == 1:
        fm_choices = [[None] for _ in shapes]
    else:
        fm_choices = [_choices([d for d, cc, s in _majors(lab, sh) if cc == c]) for sh, lab in zip(shapes, labs)]
    for fmaps in itertools.product(*fm_choices):
        if F > 1 and all(f is None for f in fmaps):
            continue
        tiles, tlabs, ok = [], [], True
        for sh, lab, f in zip(shapes, labs, fmaps):
            sh, lab = list(sh), list(lab)
            if f is not None:
                r = lb.split(lab[f], F)
                if r is None or sh[f] % F:
                    ok = False
                    break
                sh[f] //= F
                lab[f] = r[1]
            tiles.append(tuple(sh))
            tlabs.append(tuple(lab))
        if not ok:
            continue
        total = 0
        for t in tiles:
            n = itemsize
            for s in t:
                n *= s
            total += n
        if total > cfg.smem_budget:
            continue
        yield Mapping(grid, F, imaps, tuple(fmaps), classes, tuple(tiles), tuple(tlabs))


def omaps(tile: tuple, lab: lb.Labels, grid: tuple, classes: tuple) -> Iterator[tuple[tuple, tuple, lb.Labels]]:
    """Output-saver maps for a tile: (omap, saved shape, saved labels) per valid choice.

    Every grid axis > 1 goes to a distinct dim. A dim that already holds the axis'
    class elsewhere in the tile is the only sensible place for it; otherwise any
    dim may take it (a new major part of that dim's label).
    """
    axes = [a for a in range(3) if grid[a] > 1]
    nd = len(tile)
    for dims in itertools.permutations(range(nd), len(axes)):
        omap = [None, None, None]
        shape, labs = list(tile), list(lab)
        ok = True
        for a, d in zip(axes, dims):
            c = classes[a]
            holders = [e for e, l in enumerate(lab) if l and any(p[0] == c for p in l)]
            if holders and d not in holders:
                ok = False
                break
            omap[a] = d
            shape[d] *= grid[a]
            labs[d] = lb.saved(labs[d], c, grid[a])
        if ok:
            yield tuple(omap), tuple(shape), tuple(labs)
