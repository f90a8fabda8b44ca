"""ESPHome satellites in duplex mode: how the user adds and changes one."""
