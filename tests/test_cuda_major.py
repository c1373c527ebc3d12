"""``tools/cuda_major.sh`` (what ``make gpu`` installs CuPy by) reads the
driver's CUDA major version from nvidia-smi, else from nvcc, and refuses
with a message where there is no driver or its CUDA is neither 12 nor 13.
The tools it calls are stand-in scripts on a PATH of their own, each
printing what the real one prints (its header or release line)."""
import os
import subprocess

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(REPO, 'tools', 'cuda_major.sh')
SMI_HEADER = ('| NVIDIA-SMI 580.65.06    Driver Version: 580.65.06    '
              'CUDA Version: {}     |')
NVCC_RELEASE = 'Cuda compilation tools, release {}, V{}.88'


def _tool(folder, name, output, status=0):
    path = folder / name
    path.write_text('#!/bin/bash\necho "{}"\nexit {}\n'.format(output,
                                                                status))
    path.chmod(0o755)


def _major(tmp_path, driver_file=True):
    driver = tmp_path / 'driver_version'
    if driver_file:
        driver.write_text('NVRM version: 580.65.06\n')
    return subprocess.run(
        ['/bin/bash', SCRIPT], capture_output=True, text=True,
        env={'PATH': str(tmp_path / 'bin'),
             'NVIDIA_DRIVER_FILE': str(driver)}, timeout=30)


@pytest.fixture
def tools(tmp_path):
    (tmp_path / 'bin').mkdir()
    return tmp_path / 'bin'


@pytest.mark.parametrize('version, major', [('12.4', '12'), ('13.0', '13')])
def test_nvidia_smi_cuda_version(tmp_path, tools, version, major):
    _tool(tools, 'nvidia-smi', SMI_HEADER.format(version))
    _tool(tools, 'nvcc', NVCC_RELEASE.format('11.8', '11.8'))  # not asked
    job = _major(tmp_path)
    assert (job.returncode, job.stdout.strip()) == (0, major), job.stderr


def test_nvcc_where_nvidia_smi_fails(tmp_path, tools):
    _tool(tools, 'nvidia-smi', 'Failed to initialize NVML', status=9)
    _tool(tools, 'nvcc', NVCC_RELEASE.format('12.6', '12.6'))
    job = _major(tmp_path)
    assert (job.returncode, job.stdout.strip()) == (0, '12'), job.stderr


def test_no_driver_is_refused_even_with_nvcc(tmp_path, tools):
    _tool(tools, 'nvcc', NVCC_RELEASE.format('13.0', '13.0'))
    job = _major(tmp_path, driver_file=False)
    assert job.returncode == 1 and job.stdout == ''
    assert 'no NVIDIA driver' in job.stderr


def test_other_cuda_is_refused(tmp_path, tools):
    _tool(tools, 'nvidia-smi', SMI_HEADER.format('11.8'))
    job = _major(tmp_path)
    assert job.returncode == 1 and job.stdout == ''
    assert 'CUDA 11' in job.stderr and 'update' in job.stderr


def test_driver_without_a_version_says_so(tmp_path, tools):
    job = _major(tmp_path)  # the driver's file, but neither tool
    assert job.returncode == 1
    assert 'no nvcc' in job.stderr
