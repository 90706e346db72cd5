"""The applications: the products that orchestrate every layer below them.

- :mod:`graphkit.apps.report`: :func:`~graphkit.apps.report.inspect`, ``graphkit inspect``'s one-page
  HTML report (trace, parameter groups, verification, FLOPs per phase, diagram);
- :mod:`graphkit.apps.explorer`: :func:`~graphkit.apps.explorer.explore`, the ipywidgets explorer of a
  notebook (extra ``notebook``), with :mod:`graphkit.apps.panels`, the HTML of its side panels.

Nothing below imports an application; the command line (:mod:`graphkit.cli`) sits on top of them.
"""
