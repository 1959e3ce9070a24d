"""What a software stack's versions change in the memory outside PyTorch's allocator.

The GPU catalog's ``cuda_context_gib`` is a context with lazy module loading: the driver loads a
kernel image into the context only when a kernel of it is first launched. Before that, every
kernel image of every loaded library was resident from the library's first CUDA call:

- lazy loading needs a CUDA runtime of 11.7 or later; libraries built with an older runtime load
  eagerly (CUDA Programming Guide, "Lazy Loading": "11.7: Lazy loading first introduced, disabled
  by default"; "Libraries compiled using older CUDA runtime versions will load all modules
  eagerly");
- it was opt-in (``CUDA_MODULE_LOADING=LAZY``) until PyTorch 1.13 set it when unset
  (pytorch/pytorch#86509, "[1.13] Sets CUDA_MODULE_LOADING to LAZY when not set by the user") and
  CUDA 12.2 made it the Linux default (same guide, "12.2: Lazy loading enabled by default for
  Linux");
- an eager context is over a GiB: ">1000MB" before 11.7 (pytorch/pytorch#107667, ptrblck), and
  1687 MiB in nvidia-smi after one ``torch.Tensor(1).cuda()`` with torch 1.8.2+cu111
  (pytorch/pytorch#55277), against ~300-400 MiB lazily (pytorch#86509: 287,047,680 B lazy vs
  666,632,192 B eager for a process that ran one op; pytorch#109888).

:data:`EAGER_CONTEXT_GIB` takes the torch 1.8.2+cu111 figure: PyTorch's own kernel images at the
first op. A training process loads more libraries (cuBLAS, NCCL, apex / DeepSpeed extensions),
so it is a lower bound for such a stack, not a fit.

A stack is described by ``name=version`` words (``torch=1.11 cuda=11.5``, optionally
``module_loading=LAZY`` or ``EAGER`` where the run set ``CUDA_MODULE_LOADING``;
:class:`tuner.spec.overheads.StackVersions`); an unknown version keeps the catalog's figure.
:func:`study_stack` says which versions a study's models read and where they came from: the
study's ``cluster.overheads.stack`` where it states one, else the versions its cluster's valid
profile recorded (``tuner.profile.job.versions``); a disagreement between the two is one warning
line. ``CUDA_MODULE_LOADING`` is the switch itself (the CUDA guide's "Lazy Loading" section:
the environment variable enables or disables it for the process), so where the study's
``launch.env`` sets it, or else the study or the profile recorded it, it decides over the
version rule; a runtime before 11.7 still loads eagerly whatever it says.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass

from tuner.spec.overheads import StackVersions, version
from tuner.spec.study import StudySpec

EAGER_CONTEXT_GIB = 1687 / 1024
"""The CUDA context of a PyTorch process that loads its kernel images eagerly, GiB: 1687 MiB
in nvidia-smi after one tensor on the GPU (pytorch/pytorch#55277, torch 1.8.2+cu111)."""

LAZY_CUDA = (11, 7)
"""The first CUDA runtime with lazy module loading."""
LAZY_BY_TORCH = (1, 13)
"""The first PyTorch that sets ``CUDA_MODULE_LOADING=LAZY`` when it is unset."""
LAZY_BY_CUDA = (12, 2)
"""The first CUDA whose Linux driver stack loads lazily by default."""


def lazy_module_loading(stack: StackVersions) -> bool | None:
    """Whether the stack's CUDA context loads kernel images lazily; None when its versions do
    not say (the catalog's lazy figure then stands)."""
    if stack.module_loading is not None:
        return stack.module_loading.upper() == "LAZY" and _at_least(stack.cuda, LAZY_CUDA)
    cuda = version(stack.cuda)
    if cuda is not None and cuda < LAZY_CUDA:
        return False  # the runtime cannot load lazily, whatever torch asks
    torch = version(stack.torch)
    if torch is not None and torch >= LAZY_BY_TORCH:
        return True if cuda is not None else None
    if cuda is not None and cuda >= LAZY_BY_CUDA:
        return True
    if torch is not None and cuda is not None:
        return False  # 11.7-12.1 without torch's default: opt-in, off unless the run set it
    return None


def _at_least(text: str | None, least: tuple[int, int]) -> bool:
    v = version(text)
    return v is None or v >= least


def stack_overheads(stack: StackVersions) -> Mapping[str, float]:
    """The GPU catalog's overhead fields (``tuner.catalog.get_gpu``'s ``overheads``) that the
    stack's versions replace: an eager CUDA context where the versions say it loads eagerly;
    nothing where they say lazy or do not say."""
    if lazy_module_loading(stack) is False:
        return {"cuda_context_gib": EAGER_CONTEXT_GIB}
    return {}


LOADING_ENV = "CUDA_MODULE_LOADING"
"""The environment variable that switches lazy module loading (CUDA Programming Guide, "Lazy
Loading"), as a study's ``launch.env`` may set it."""
STATED = "the study's cluster.overheads.stack"
LAUNCH_ENV = "the study's launch.env"


@dataclass(frozen=True, slots=True)
class StackChoice:
    """The stack's versions a study's models read (:func:`study_stack`), and where from."""

    versions: StackVersions
    """The versions, ``module_loading`` the switch that decides (:attr:`loading_source`)."""
    source: str | None
    """Where the versions came from (:data:`STATED` or the profile's ``cluster profile NAME
    (measured WHEN)``); None: nowhere (the catalog's figures stand)."""
    loading_source: str | None = None
    """Where ``module_loading`` came from; None: the version rule decides."""
    disagreement: str | None = None
    """One warning line where the study's statement and the profile's record (or the launch's
    ``CUDA_MODULE_LOADING``) disagree; None where they agree."""

    def to_dict(self) -> dict[str, str | None]:
        """``tune estimate --format json``'s ``stack``."""
        return {
            "versions": self.versions.words(), "source": self.source,
            "module_loading_source": self.loading_source, "summary": self.summary(),
        }  # fmt: skip

    def summary(self) -> str:
        """What ``tune estimate`` says of it: the versions, where they came from, and the
        module loading they give."""
        lazy = lazy_module_loading(self.versions)
        loading = (
            "lazy module loading (the catalog's CUDA context)" if lazy
            else f"eager module loading (a {EAGER_CONTEXT_GIB * 1024:.0f} MiB CUDA context: "
            "every kernel image resident)" if lazy is False
            else "no CUDA runtime among them (the catalog's CUDA context)"
            if self.versions.cuda is None
            else "module loading not decided by them (the catalog's CUDA context)"
        )  # fmt: skip
        if self.source is None and self.loading_source is None:
            return "stack versions: none stated or recorded (the catalog's CUDA context)"
        where = f"from {self.source}" if self.source else "none stated or recorded"
        switch = f"; {LOADING_ENV} from {self.loading_source}" if self.loading_source else ""
        return f"stack versions: {self.versions.words() or '-'} {where}{switch}: {loading}"


def study_stack(spec: StudySpec) -> StackChoice:
    """The stack's versions ``spec``'s models read: its ``cluster.overheads.stack`` where it
    states one, else the ones its cluster's profile recorded (``spec.cluster.recorded_stack``); the
    module loading from its ``launch.env``'s ``CUDA_MODULE_LOADING``, else the study's stated
    switch, else the profile's recorded one (where its versions do not disagree with the
    study's), else the version rule (:func:`lazy_module_loading`)."""
    stated, recorded = spec.cluster.overheads.versions(), spec.cluster.recorded_stack
    if stated.known or recorded is None or not recorded.versions.known:
        versions, source = stated, STATED if stated.known else None
    else:
        versions, source = recorded.versions, recorded.source
    differ = _differences(stated, recorded.versions, recorded.source) if recorded else []
    loading, loading_source = versions.module_loading, source if versions.module_loading else None
    if loading is None and recorded and recorded.versions.module_loading and not differ:
        loading, loading_source = recorded.versions.module_loading, recorded.source
    env = spec.launch.env.get(LOADING_ENV, "").upper()
    if env in ("LAZY", "EAGER"):
        if loading is not None and loading.upper() != env:
            differ.append(f"module_loading {loading} in {loading_source}, {LOADING_ENV}={env} "
                          f"in {LAUNCH_ENV}, which decides")  # fmt: skip
        loading, loading_source = env, LAUNCH_ENV
    said = f"stack versions disagree: {'; '.join(differ)}" if differ else None
    return StackChoice(dataclasses.replace(versions, module_loading=loading), source,
                       loading_source, said)  # fmt: skip


def _differences(stated: StackVersions, recorded: StackVersions, where: str) -> list[str]:
    """``torch 1.11 in the study's ..., 2.1.0 in cluster profile ...`` for each version both
    give that differs (in major.minor where both are versions, else as written), and which one
    is used (the study's)."""
    out = []
    for name in ("torch", "cuda", "nccl", "module_loading"):
        a, b = getattr(stated, name), getattr(recorded, name)
        if a is None or b is None:
            continue
        va, vb = version(a), version(b)
        if (va != vb) if va and vb else a.upper() != b.upper():
            out.append(f"{name} {a} in {STATED} (used), {b} in {where}")
    return out
