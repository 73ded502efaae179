"""ppdist: PaddleOCR / PaddleDetection / PaddleSeg training on PyTorch with one distributed trainer."""

from setuptools import find_packages, setup

setup(
    name="ppdist",
    version="0.1.0",
    description=(
        "Config-driven PyTorch training of CRNN, PP-OCRv3, SLANet, PP-YOLOE, Faster R-CNN, Cascade R-CNN, "
        "PP-LiteSeg, OCRNet and SegFormer with a shared torchrun trainer"
    ),
    long_description=open("README.md", encoding="utf-8").read(),
    long_description_content_type="text/markdown",
    packages=find_packages(include=["ppdist", "ppdist.*"]),
    # PaddleOCR's Chinese, English and table structure dictionaries (Apache-2.0, see ppdist/data/dicts/README.md)
    package_data={"ppdist.data": ["dicts/*.txt", "dicts/README.md"]},
    python_requires=">=3.9",
    install_requires=[
        "torch>=2.3,<3",  # torchrun LogsSpecs (ppdist.launch --log_dir)
        "torchvision>=0.18",
        "numpy>=1.23",
        "pyyaml>=6.0",
        "opencv-python-headless>=4.7",
        "pillow>=10.1",
        "pycocotools>=2.0.6",
        "faster-coco-eval>=1.6",  # COCOMetric backend: faster_coco_eval (Objects365-size sets)
        "lmdb>=1.4",
        "rapidfuzz>=3.0",
        "tqdm>=4.64",
        "tensorboard>=2.12",
        "matplotlib>=3.7",  # training curves, PR curves, confusion matrices, galleries (issue 21)
        "onnx>=1.16",
        "onnxruntime>=1.18",
        "onnxscript>=0.3",  # torch.onnx's dynamo exporter (fallback for graphs the TorchScript-based one rejects)
        "apted>=1.0.3",  # TEDS tree edit distance of the table metric (issue 31)
        "lxml>=4.6",  # TEDS: the HTML tree of a table (issue 31)
    ],
    # ruff pinned: its formatting changes between releases (tests/test_code_style.py runs it).
    # trackers: MLflow (Global.mlflow; the skinny client has the local file store) and W&B
    # (Global.use_wandb / the wandb section); the tests run both, offline.
    extras_require={
        "trackers": ["mlflow-skinny>=2.9", "wandb>=0.16"],
        "test": ["pytest>=7.4", "pytest-xdist>=3.5", "ruff==0.17.6", "mlflow-skinny>=2.9", "wandb>=0.16"],
    },
)
