"""Cost formulas of the replay that are not in the profile: fused optimizer updates
(``torch._foreach_*``, the compiled path) and the bytes a collective puts on the wire.

Policy: analytical, memory-bound estimates from the cluster's device and host
figures; the constants below are per optimizer, assumed where no figure is cited.
"""

from ..core.dtypes import torch_dtype

__all__ = ["FOREACH", "FOREACH_GPU", "FOREACH_PER_TENSOR_S", "UPDATED", "foreach_cost",
           "wire_bytes"]

# Fused optimizer updates (ops.optim.FUSED, compiled path): torch._foreach_* calls per
# update and bytes moved per parameter byte (each call reads and writes whole lists);
# on CPU places sgd and momentum add the step with alpha=-lr, on GPUs they multiply by
# the lr tensor first (one more call and list)
FOREACH = {"sgd": (1, 3), "momentum": (3, 8), "adam": (16, 30)}
FOREACH_GPU = {"sgd": (2, 5), "momentum": (4, 10), "adam": (16, 30)}
FOREACH_PER_TENSOR_S = 0.25e-6  # host time per list element of a foreach call (assumed)
UPDATED = {"sgd": 1, "momentum": 2, "adam": 3}  # tensors an update writes (param, moments)



def foreach_cost(group, program, cluster, host, gpu, cuda_graph):
    """``(host_s, device_s, label)`` of one ``torch._foreach_*`` update for ``group``, a
    list of optimizer handles of one type (``runtime.fusion``), memory-bound."""
    calls, traffic = (FOREACH_GPU if gpu else FOREACH)[group[0].op.type]
    block = program.global_block()
    nbytes = 0
    for h in group:
        var = block.find_var(h.op.input("Param")[0])
        if var is not None and var.numel is not None:
            nbytes += var.numel * torch_dtype(var.dtype).itemsize
    dev = cluster.device
    if gpu:
        bw = dev.mem_bw * 0.7 if dev.mem_bw else 1e12
    else:
        bw = cluster.local_sum[1] if cluster.local_sum else 10e9
    device_s = calls * dev.kernel_min + traffic * nbytes / bw
    host_s = 0.0 if cuda_graph else calls * (host.op_s + len(group) * FOREACH_PER_TENSOR_S)
    if group[0].op.input("SkipUpdate"):
        # fp16 loss scaling (codegen): one foreach snapshot of the updated tensors, then
        # one ``where`` per updated tensor puts back a skipped step's old values
        wheres = len(group) * UPDATED[group[0].op.type]
        device_s += (1 + wheres) * dev.kernel_min + \
            5 * UPDATED[group[0].op.type] * nbytes / bw
        if not cuda_graph:
            host_s += host.op_s * (1 + wheres) + wheres * FOREACH_PER_TENSOR_S
    return host_s, device_s, f"{group[0].op.type}_foreach#{group[-1].op_index}"


def wire_bytes(handle, program):
    """Bytes one place sends into collective ``handle`` (compressed dtypes counted)."""
    block = program.global_block()
    # a compressed all-reduce's wire type, a ZeRO gather's low-precision type
    wire = getattr(handle, "wire_dtype", None)
    total = 0
    for n in handle.var_names:
        var = block.find_var(n)
        if var is None or var.numel is None:
            continue
        dtype = torch_dtype(var.dtype)
        if wire is not None and dtype.is_floating_point:
            dtype = torch_dtype(wire)
        total += var.numel * dtype.itemsize
    return total
