# swerl: `source /opt/miniconda3/bin/activate` for SWE-bench-layout images without conda, whose testbed
# environment is a venv at the conda env's path (/opt/miniconda3/envs/NAME). SWE-bench's scripts then
# run `conda activate NAME`: here that sources the venv's own activate script. Nothing else of conda
# exists, and anything else says so.
conda() {
    if [ "$#" = 2 ] && [ "$1" = activate ] && [ -f "/opt/miniconda3/envs/$2/bin/activate" ]; then
        . "/opt/miniconda3/envs/$2/bin/activate"
    else
        echo "conda: this image has no conda, only 'conda activate ENV' for the venv at /opt/miniconda3/envs/ENV" >&2
        return 1
    fi
}
