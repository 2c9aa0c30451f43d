#!/bin/bash
# Runs a test script with Debian's /usr/bin/python3: the interpreter tools/setup.sh gives
# python3-yaml and kubernetes-validate (the python3 first on PATH may lack them).
exec /usr/bin/python3 -u "$@"
