import pytest
from pydantic import ValidationError

from fedveil.config import ClientConfig
from fedveil.training.local import LocalTrainer, task_loss
from fedveil.seeding import torch_generator
from harness import SEED, assert_params_equal, make_algorithm, make_task, run_rounds

CLIENT = {"batch_size": 1, "steps": 1, "lr": 0.05, "momentum": 0.5, "lr_schedule": "exponential", "lr_decay": 0.5}


def test_params():
    hp = make_algorithm("fedavg_ft").hp
    assert (hp.finetune_epochs, hp.finetune_lr) == (1, None)
    assert make_algorithm("fedavg_ft").has_personal_models
    with pytest.raises(ValidationError):
        make_algorithm("fedavg_ft", finetune_epochs=-1)
    with pytest.raises(ValidationError):
        make_algorithm("fedavg_ft", finetune_lr=0.0)


def test_trains_exactly_like_fedavg():
    avg = run_rounds(make_algorithm("fedavg", client=CLIENT), 2)
    ft = run_rounds(make_algorithm("fedavg_ft", client=CLIENT, finetune_epochs=3), 2)
    assert_params_equal(ft.server["params"], avg.server["params"])


def test_zero_epochs_gives_the_global_model():
    alg = make_algorithm("fedavg_ft", client=CLIENT, finetune_epochs=0)
    run = run_rounds(alg, 2)
    personal = alg.personal_params(run.server, None, make_task(alg, 1, 2, "personal"))
    assert_params_equal(personal, run.server["params"])


def finetuned(alg, server, cid, round_idx, **config):
    """The global model trained directly by a fresh LocalTrainer with ``config``."""
    trainer = LocalTrainer(alg.ctx.model, task_loss("regression"), ClientConfig(**config), alg.ctx.rounds)
    gen = torch_generator(SEED, "personal", round_idx, cid)
    return trainer.train(server["params"], alg.ctx.data.clients[cid].train, gen, round_idx)[0]


def test_finetuning_with_its_own_lr():
    alg = make_algorithm("fedavg_ft", client=CLIENT, finetune_epochs=2, finetune_lr=0.3)
    run = run_rounds(alg, 2)
    personal = alg.personal_params(run.server, None, make_task(alg, 2, 1, "personal"))
    expected = finetuned(alg, run.server, 2, 1, **{**CLIENT, "steps": None, "epochs": 2, "lr": 0.3})
    assert_params_equal(personal, expected)


def test_finetuning_defaults_to_the_client_lr_and_ignores_fixed_steps():
    alg = make_algorithm("fedavg_ft", client=CLIENT)
    run = run_rounds(alg, 2)
    personal = alg.personal_params(run.server, None, make_task(alg, 2, 1, "personal"))
    # one epoch = 4 steps of batch 1 at the round's lr 0.05 * 0.5, not the client's 1 step
    assert_params_equal(personal, finetuned(alg, run.server, 2, 1, **{**CLIENT, "steps": None}))
    one_step = finetuned(alg, run.server, 2, 1, **CLIENT)
    assert not all(personal[k].equal(one_step[k]) for k in personal)
