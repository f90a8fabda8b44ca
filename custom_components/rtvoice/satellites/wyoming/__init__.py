"""Wyoming satellites: how the user adds and changes one."""
