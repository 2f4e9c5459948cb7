"""The diffusion-model architectures ComfyUI detects from a checkpoint's keys, as data.

ComfyUI does not build a model from the sizes a file records: it reads a few keys' shapes
(``comfy/model_detection.py`` ``detect_unet_config``), picks an architecture and builds every
layer at the sizes that architecture gives it.  Each module here describes one architecture
(the keys its detection reads, the dimensions it derives, every parameter the model registers,
in registration order, and the order its forward runs its layers); ``registry`` holds them in
ComfyUI's order of checks, with the prefix rule ComfyUI applies before detecting.  Header only:
names and shapes, never tensor data and never torch.
"""
