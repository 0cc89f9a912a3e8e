"""The library's C ABI from Python (ctypes), for the bench scripts that call it directly:
fly_tensor descriptors of torch tensors and the loaded library with its string returns typed."""
import ctypes

import torch

FLY_BF16, FLY_F16, FLY_F32 = 2, 1, 3


class FlyTensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("dtype", ctypes.c_int), ("rank", ctypes.c_int32),
                ("sizes", ctypes.c_int64 * 8), ("strides", ctypes.c_int64 * 8)]


def desc(t):
    """A fly_tensor describing torch tensor t (bf16, fp16 or fp32; any strides)."""
    d = FlyTensor()
    d.data = t.data_ptr()
    d.dtype = {torch.bfloat16: FLY_BF16, torch.float16: FLY_F16, torch.float32: FLY_F32}[t.dtype]
    d.rank = t.dim()
    for i in range(t.dim()):
        d.sizes[i] = t.shape[i]
        d.strides[i] = t.stride(i)
    return d


def load(path):
    """libflykernels.so at `path`, with fly_get_last_error / fly_last_variant returning bytes."""
    lib = ctypes.CDLL(path)
    lib.fly_get_last_error.restype = ctypes.c_char_p
    lib.fly_last_variant.restype = ctypes.c_char_p
    return lib
