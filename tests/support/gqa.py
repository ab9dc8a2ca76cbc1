"""What ONNX Runtime's GroupQueryAttention accepts, asked of ONNX Runtime itself."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
from onnx import TensorProto, helper


def gqa_accepts(head_size: int, rotary: bool, new: int, past: int, heads: int = 2,
                kv_heads: int = 1) -> bool:
    """Does ONNX Runtime's CPU GroupQueryAttention run one call of this shape?"""
    capacity = new + past + 2
    width, kv_width = heads * head_size, kv_heads * head_size
    attributes = {"num_heads": heads, "kv_num_heads": kv_heads}
    names = ["q", "k", "v", "past_k", "past_v", "seqlens_k", "total"]
    shapes = {"q": [1, new, width], "k": [1, new, kv_width], "v": [1, new, kv_width],
              "past_k": [1, kv_heads, capacity, head_size],
              "past_v": [1, kv_heads, capacity, head_size]}
    if rotary:
        attributes["do_rotary"] = 1
        names += ["cos", "sin"]
        shapes |= {"cos": [capacity, max(head_size // 2, 1)],
                   "sin": [capacity, max(head_size // 2, 1)]}
    node = helper.make_node("GroupQueryAttention", names, ["out", "present_k", "present_v"],
                            domain="com.microsoft", **attributes)
    inputs = [helper.make_tensor_value_info(name, TensorProto.FLOAT, shape)
              for name, shape in shapes.items()]
    inputs.insert(5, helper.make_tensor_value_info("seqlens_k", TensorProto.INT32, [1]))
    inputs.insert(6, helper.make_tensor_value_info("total", TensorProto.INT32, []))
    outputs = [helper.make_tensor_value_info(name, TensorProto.FLOAT, None)
               for name in ("out", "present_k", "present_v")]
    model = helper.make_model(helper.make_graph([node], "gqa", inputs, outputs), ir_version=10,
                              opset_imports=[helper.make_opsetid("", 18),
                                             helper.make_opsetid("com.microsoft", 1)])
    rng = np.random.default_rng(0)
    feeds = {name: rng.normal(size=shape).astype(np.float32) for name, shape in shapes.items()}
    feeds |= {"seqlens_k": np.array([new + past - 1], np.int32),
              "total": np.array(new + past, np.int32)}
    options = ort.SessionOptions()
    options.log_severity_level = 4  # the refusal is the answer here, not news
    try:
        session = ort.InferenceSession(model.SerializeToString(), options,
                                       providers=["CPUExecutionProvider"])
        session.run(None, feeds)
    except Exception as exc:  # ORT's refusal of the shape
        assert "head_size" in str(exc), exc  # refused for the head size, not the test's shapes
        return False
    return True
