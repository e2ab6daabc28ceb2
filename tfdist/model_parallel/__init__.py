"""Model parallelism: layers on explicit devices, pipeline stages, tensor-parallel layers.

`plan` is pure arithmetic (no TensorFlow); `placement`, `pipeline` and
`tensor_parallel` import TensorFlow only inside functions.
"""
