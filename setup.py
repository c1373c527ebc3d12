from setuptools import find_packages
from setuptools import setup

setup(
    name='cgdp-chainer',
    version='0.1.0',
    description='CPU-GPU data parallel (CGDP) training for Chainer',
    # With the subpackages (cgdp_chainer.runtime, .costmodel, .mpi).
    packages=find_packages(include=['cgdp_chainer', 'cgdp_chainer.*',
                                    'models', 'models.*',
                                    'experiments', 'experiments.*']),
    python_requires='>=3.11',
    install_requires=[
        'chainer==7.8.1',
        'numpy',
        'threadpoolctl',
        'cloudpickle',
        'matplotlib',
        'Pillow',
    ],
    extras_require={
        'mpi': ['mpi4py', 'mpich'],
        # CUDA 12's CuPy; `make gpu` picks the driver's (gpu-cuda13).
        'gpu': ['cupy-cuda12x'],
        'gpu-cuda13': ['cupy-cuda13x'],
        'test': ['pytest'],
    },
)
