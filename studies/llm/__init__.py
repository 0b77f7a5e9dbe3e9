"""SmolLM2-135M (a real pretrained Llama-style LLM) for the tensor studies: loader, model, capture (``[llm]`` extra)."""
