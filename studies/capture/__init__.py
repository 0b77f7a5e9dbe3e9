"""The bundled captures the tensor studies read, made by small deterministic NumPy trainings: the toy byte-level
MLP LM (:mod:`studies.capture.example`, ``studies/data/tinylm_capture.safetensors``) and its 12-linear residual
variant (:mod:`studies.capture.deep`, ``studies/data/deep_capture.safetensors``)."""
