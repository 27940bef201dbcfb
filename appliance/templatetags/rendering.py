from django import template
from django.utils.safestring import mark_safe

from appliance.rendering import render_markdown

register = template.Library()


@register.filter
def markdown(text: str) -> str:
    """Model output rendered as sanitised Markdown (see ``appliance.rendering``)."""
    return mark_safe(render_markdown(text))  # noqa: S308 - cleaned by an allowlist sanitiser
