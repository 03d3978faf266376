"""tfcompile.kernels.formats: float tensors <-> low-precision formats.

The plain-torch modules (elements, packing, fp8, mx, nvfp4, qtensor, swizzle)
are the readable reference that every kernel and pass is tested against;
`impl="auto"` routes the weight quantizers through fused C kernels (`fast`,
`_native`) that are proven bit-identical. `quantizer` holds one object per
weight format and activation treatment (`weight_quantizer`, `act_quantizer`):
what every pass, distillation, evaluation and the runtime call instead of
branching on a format name. Rules and sources: docs/formats.md.
"""

from .elements import (E2M1_MAX, E2M1_VALUES, E4M3_MAX, cast_e4m3, decode_e2m1, decode_e8m0,
                       e2m1_step, encode_e2m1, encode_e8m0, round_e2m1)
from .fp8 import dequantize_fp8_act, fp8_weight_scale, quantize_fp8, quantize_fp8_act, weight_amax
from ._native import kernel_threads
from .swizzle import from_blackwell_scale_layout, to_blackwell_scale_layout
from .mx import DEFAULT_MX_RULE, DEFAULT_MXFP8_RULE, mx_shared_exponent, quantize_mx_act, quantize_mxfp4, quantize_mxfp8
from .nvfp4 import (global_scale_from_modelopt, global_scale_to_modelopt, nvfp4_global_scale,
                    quantize_nvfp4, quantize_nvfp4_act)
from .packing import pack_fp4, unpack_fp4
from .qtensor import QTensor, dequantize, dequantize_rows
from .quantizer import (ActQuantizer, WeightQuantizer, act_quantizer, quantizer_from_stored, quantizer_of,
                        round_scale_up, weight_quantizer)

__all__ = [
    "E2M1_MAX", "E2M1_VALUES", "E4M3_MAX", "cast_e4m3", "decode_e2m1", "decode_e8m0",
    "encode_e2m1", "encode_e8m0", "e2m1_step", "round_e2m1", "pack_fp4", "unpack_fp4", "QTensor", "dequantize", "dequantize_rows",
    "quantize_fp8", "quantize_fp8_act", "dequantize_fp8_act", "fp8_weight_scale", "weight_amax",
    "DEFAULT_MX_RULE", "DEFAULT_MXFP8_RULE", "mx_shared_exponent", "quantize_mxfp8", "quantize_mxfp4", "quantize_mx_act",
    "quantize_nvfp4", "quantize_nvfp4_act", "nvfp4_global_scale",
    "global_scale_to_modelopt", "global_scale_from_modelopt",
    "to_blackwell_scale_layout", "from_blackwell_scale_layout", "kernel_threads",
    "WeightQuantizer", "ActQuantizer", "weight_quantizer", "act_quantizer", "quantizer_of", "quantizer_from_stored",
    "round_scale_up",
]
