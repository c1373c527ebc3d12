#!/usr/bin/env bash
# Prints the CUDA major version this machine's NVIDIA driver runs (12 or
# 13), for `make gpu` to pick the CuPy wheel: nvidia-smi's "CUDA Version"
# (the newest CUDA the driver supports), else nvcc's release. Exits 1 with
# a message when there is no driver (nvidia-smi failing and no
# $NVIDIA_DRIVER_FILE, by default /proc/driver/nvidia/version: a CUDA
# toolkit alone runs nothing), or when its CUDA is neither 12 nor 13. Bash
# built-ins only, besides the two tools.
set -u
driver_file=${NVIDIA_DRIVER_FILE:-/proc/driver/nvidia/version}
major=''
smi=no
if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi >/dev/null 2>&1; then
    smi=yes
fi
if [ $smi = no ] && [ ! -r "$driver_file" ]; then
    echo 'make gpu: no NVIDIA driver here (nvidia-smi is missing or fails,' \
         "and there is no $driver_file); CuPy needs a CUDA GPU and its" \
         "driver. Without one, train on the CPU ('@numpy') and leave make" \
         'gpu out.' >&2
    exit 1
fi
if [ $smi = yes ]; then
    while IFS= read -r line; do
        if [[ $line =~ CUDA\ Version:\ *([0-9]+)\. ]]; then
            major=${BASH_REMATCH[1]}
            break
        fi
    done < <(nvidia-smi 2>/dev/null)
fi
if [ -z "$major" ] && command -v nvcc >/dev/null 2>&1; then
    while IFS= read -r line; do
        if [[ $line =~ release\ ([0-9]+)\. ]]; then
            major=${BASH_REMATCH[1]}
            break
        fi
    done < <(nvcc --version 2>/dev/null)
fi
if [ -z "$major" ]; then
    echo 'make gpu: the NVIDIA driver is there but its CUDA version is' \
         'not: nvidia-smi shows no "CUDA Version" and there is no nvcc' \
         '(install the CUDA toolkit, or a newer driver).' >&2
    exit 1
fi
case "$major" in
    12|13) echo "$major" ;;
    *)
        echo "make gpu: the driver runs CUDA $major; this project installs" \
             'CuPy for CUDA 12 (cupy-cuda12x) or 13 (cupy-cuda13x): update' \
             'the NVIDIA driver.' >&2
        exit 1 ;;
esac
