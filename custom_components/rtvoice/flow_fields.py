"""Form fields the config, options and satellite flows share."""

from __future__ import annotations

from homeassistant.helpers.selector import (
    NumberSelector,
    NumberSelectorConfig,
    NumberSelectorMode,
    TextSelector,
    TextSelectorConfig,
    TextSelectorType,
)

# A secret (API key, encryption key): masked in the form, never suggested back.
PASSWORD_SELECTOR = TextSelector(TextSelectorConfig(type=TextSelectorType.PASSWORD))


def number_selector(
    minimum: float,
    maximum: float,
    *,
    step: float = 1,
    mode: NumberSelectorMode = NumberSelectorMode.BOX,
    unit: str | None = None,
) -> NumberSelector:
    """Return a number field with its range (and unit) shown."""
    config = NumberSelectorConfig(min=minimum, max=maximum, step=step, mode=mode)
    if unit is not None:
        config["unit_of_measurement"] = unit
    return NumberSelector(config)
