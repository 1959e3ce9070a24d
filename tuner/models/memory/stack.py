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
:class:`tuner.spec.overheads.StackVersions`, a study's ``cluster.overheads.stack``); an unknown
version keeps the catalog's figure.
"""

from __future__ import annotations

from collections.abc import Mapping

from tuner.spec.overheads import StackVersions, version

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
