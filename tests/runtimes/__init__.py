"""The real runtimes as oracles: a generated space of defective checkpoints (``cases``), one
driver per runtime that loads a file the way that runtime does and records what happened
(``comfyui_driver``, ``kitchen_driver``, ``sglang_driver``), and the ``Outcome`` record they
share with comfyquant's verdicts (``outcome``).  The whole-model oracle: tiny real models and
their defects (``whole_models``), run by ComfyUI's own loading path (``comfyui_models``) and
compared with the verdicts (``model_agreement``)."""
