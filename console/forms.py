"""The console's capacity planner form: a model's shape, a device's memory, a context length and
a memory utilisation. Every field may be left empty: the planner then takes the served model, this
machine's memory and the configured context (``console.selectors.capacity_plan``), which also
decides whether a shape is complete."""

from __future__ import annotations

from django import forms

from inference.capacity import (
    DTYPE_BYTES,
    GIB,
    MAX_CONTEXT_TOKENS,
    MAX_HEAD_DIM,
    MAX_KV_HEADS,
    MAX_LAYERS,
    MAX_MEMORY_GIB,
    MAX_PARAMETERS,
)

DTYPE_CHOICES = [(name, f"{name} ({size:g} byte{'' if size == 1 else 's'})") for name, size in DTYPE_BYTES.items()]


def _positive(name: str):
    def check(value):
        if value is not None and value <= 0:
            raise forms.ValidationError(f"{name} must be more than 0.")

    return check


class CapacityForm(forms.Form):
    layers = forms.IntegerField(
        required=False, min_value=1, max_value=MAX_LAYERS, label="Layers", help_text="num_hidden_layers"
    )
    kv_heads = forms.IntegerField(
        required=False, min_value=1, max_value=MAX_KV_HEADS, label="KV heads", help_text="num_key_value_heads"
    )
    head_dim = forms.IntegerField(
        required=False, min_value=1, max_value=MAX_HEAD_DIM, label="Head size", help_text="head_dim"
    )
    parameters = forms.FloatField(
        required=False,
        min_value=1,
        max_value=MAX_PARAMETERS,
        label="Parameters",
        help_text="e.g. 8.03e9",
        widget=forms.TextInput(attrs={"inputmode": "decimal", "spellcheck": "false"}),
    )
    weight_dtype = forms.ChoiceField(
        required=False,
        choices=[("", "the model's (bfloat16 for a shape given here)"), *DTYPE_CHOICES],
        label="Weight precision",
    )
    kv_dtype = forms.ChoiceField(
        required=False,
        choices=[("", "as configured (APPLIANCE_KV_CACHE_DTYPE)"), ("auto", "auto: the weights'"), *DTYPE_CHOICES],
        label="KV-cache precision",
    )
    memory_gib = forms.FloatField(
        required=False,
        max_value=MAX_MEMORY_GIB,
        validators=[_positive("Device memory")],
        label="Device memory (GiB)",
        help_text="empty: the engine's GPU, or this machine's memory",
        widget=forms.NumberInput(attrs={"min": "0", "step": "any"}),
    )
    context_tokens = forms.IntegerField(
        required=False,
        min_value=1,
        max_value=MAX_CONTEXT_TOKENS,
        label="Context (tokens per request)",
        help_text="empty: APPLIANCE_MAX_MODEL_LEN",
    )
    memory_utilization = forms.FloatField(
        required=False,
        max_value=1,
        validators=[_positive("Memory utilisation")],
        label="Memory utilisation",
        help_text="share of the device for weights and KV cache, more than 0 and at most 1",
        widget=forms.NumberInput(attrs={"min": "0", "max": "1", "step": "any"}),
    )

    gpus_per_engine = forms.IntegerField(
        required=False, min_value=1, max_value=64, label="GPUs per engine",
        help_text="tensor parallel: the model spread over this many devices; empty: APPLIANCE_TENSOR_PARALLEL_SIZE",
    )  # fmt: skip
    engines = forms.IntegerField(
        required=False, min_value=1, max_value=10_000, label="Engines in the cluster",
        help_text="empty: the engines the cluster's nodes report",
    )  # fmt: skip

    def show_defaults(self, **defaults) -> None:
        """Show what an empty field stands for, as its placeholder."""
        for name, value in defaults.items():
            self.fields[name].widget.attrs["placeholder"] = str(value)

    def plan_arguments(self) -> dict:
        """The valid form as ``capacity_plan``'s arguments (empty fields: None, its defaults)."""
        data = self.cleaned_data
        memory_gib = data.get("memory_gib")
        return {
            "layers": data.get("layers"),
            "kv_heads": data.get("kv_heads"),
            "head_dim": data.get("head_dim"),
            "parameters": data.get("parameters"),
            "weight_dtype": data.get("weight_dtype") or None,
            "kv_dtype": data.get("kv_dtype") or None,
            "memory_bytes": int(memory_gib * GIB) if memory_gib is not None else None,
            "context_tokens": data.get("context_tokens"),
            "memory_utilization": data.get("memory_utilization"),
            "gpus_per_engine": data.get("gpus_per_engine"),
            "engines": data.get("engines"),
        }
