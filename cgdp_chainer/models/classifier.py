"""A classifier link that understands auxiliary outputs, split into a head.

``chainer.links.Classifier`` computes the predictor and the loss in one
call; :class:`Classifier` also offers the loss part alone, as :meth:`head`.
It also accepts GoogLeNet's training-mode output ``(main, aux1, aux2)``.
"""
import chainer
import chainer.links as L
from chainer import reporter


class Classifier(L.Classifier):
    """``chainer.links.Classifier`` with auxiliary losses and a separate head.

    ``forward(x, t) == head(predictor(x), t)``. When the predictor returns
    a tuple ``(main, aux...)``, the loss is
    ``lossfun(main, t) + aux_loss_weight * sum(lossfun(aux, t))`` and the
    accuracy is measured on ``main``.

    Args:
        predictor (chainer.Link): The network.
        aux_loss_weight (float): Weight of each auxiliary loss; 0.3 is the
            GoogLeNet paper's.
        lossfun (callable): Loss of one output, ``lossfun(y, t)``.
        accfun (callable): Accuracy of the main output, ``accfun(y, t)``.
        label_key (int or str): Where the labels are among the arguments
            of ``forward``, as in ``chainer.links.Classifier``.
    """

    def __init__(self, predictor, aux_loss_weight=0.3,
                 lossfun=chainer.functions.softmax_cross_entropy,
                 accfun=chainer.functions.accuracy, label_key=-1):
        super(Classifier, self).__init__(predictor, lossfun=lossfun,
                                         accfun=accfun, label_key=label_key)
        self.aux_loss_weight = aux_loss_weight

    def _split_label(self, args, kwargs):
        # The same argument convention as chainer.links.Classifier.forward.
        if isinstance(self.label_key, int):
            if not -len(args) <= self.label_key < len(args):
                raise ValueError(
                    'Label key {} is out of bounds'.format(self.label_key))
            t = args[self.label_key]
            if self.label_key == -1:
                args = args[:-1]
            else:
                args = args[:self.label_key] + args[self.label_key + 1:]
        else:
            if self.label_key not in kwargs:
                raise ValueError(
                    'Label key "{}" is not found'.format(self.label_key))
            kwargs = dict(kwargs)
            t = kwargs.pop(self.label_key)
        return args, kwargs, t

    def forward(self, *args, **kwargs):
        """Runs the predictor and :meth:`head`.

        Args:
            args: Input minibatch and labels (see ``label_key``).
            kwargs: Input minibatch and labels (see ``label_key``).

        Returns:
            chainer.Variable: The loss.
        """
        args, kwargs, t = self._split_label(args, kwargs)
        # Drop the previous iteration's graph before building a new one.
        self.y = None
        self.loss = None
        self.accuracy = None
        return self.head(self.predictor(*args, **kwargs), t)

    def head(self, y, t):
        """Computes and reports the loss (and accuracy) of an output.

        Args:
            y (chainer.Variable or tuple): The predictor's output: logits,
                or ``(main, aux...)`` logits.
            t (chainer.Variable or array): Labels.

        Returns:
            chainer.Variable: The loss, auxiliary terms included.
        """
        self.y = y
        if isinstance(y, tuple):
            main, auxiliaries = y[0], y[1:]
        else:
            main, auxiliaries = y, ()
        loss = self.lossfun(main, t)
        for auxiliary in auxiliaries:
            loss = loss + self.aux_loss_weight * self.lossfun(auxiliary, t)
        self.loss = loss
        reporter.report({'loss': loss}, self)
        if self.compute_accuracy:
            self.accuracy = self.accfun(main, t)
            reporter.report({'accuracy': self.accuracy}, self)
        return loss
