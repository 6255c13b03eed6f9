"""``rayfed check``: a method's two rounds, stacked and one client at a time, compared, and the mistakes it names.

``method_check`` runs them (``rayfed.check(name)``), ``path_comparison`` compares the two paths' uploads and
states, and ``method_mistakes`` names what a method got wrong in one line each (docs/methods.md, "rayfed check").
"""
