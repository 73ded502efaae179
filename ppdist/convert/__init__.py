"""Reading PaddlePaddle artefacts (weights files) without Paddle installed."""
