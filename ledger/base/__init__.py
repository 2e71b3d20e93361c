"""Base: small helpers every other package may use, with no dependency on the rest of the project.

Text made safe for terminals and files (``textsafe``, ``safeout``), file modes (``fsmodes``), the hooks' frozen
record class (``frozen``), the one runner of external programs (``commands``), the site configuration file
(``config``), billing periods (``periods``), the CLI's progress bar (``progressbar``), glibc heap settings
(``heap``) and how worker processes start (``processes``). Standard library only; imports nothing of the project.
"""
