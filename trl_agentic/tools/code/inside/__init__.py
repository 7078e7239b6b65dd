"""Code that runs *inside* a sandbox worker (standard library only). The package never imports these modules at
run time: :mod:`trl_agentic.tools.code.worker` reads their source and starts ``python -I -c <source>``."""
