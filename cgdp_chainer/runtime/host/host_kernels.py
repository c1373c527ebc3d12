"""The numba kernels of :mod:`cgdp_chainer.runtime.host.host_update`.

A module of its own so that numba is imported (and the kernels compiled)
only when the numba backend is used. Each kernel computes, per block of
``NUMBA_BLOCK`` elements, the gradient from the slots into a buffer that
stays in cache, applies the hook program and updates the parameter and its
state, with the same float32 operations in the same order as Chainer's NumPy
expressions (see ``host_update`` for the NumPy twins).
"""
import numba
import numpy

NUMBA_BLOCK = 2048

# Loops index slices from 0 so that LLVM sees non-negative indices,
# drops numba's wraparound checks and vectorizes them.
_jit = numba.njit(nogil=True, cache=True, error_model='numpy')
# Hook codes, as host_update.hook_program writes them: 0 WeightDecay,
# 1 Lasso, 2 GradientHardClipping, 3 the loss scale's division. With
# ``write_g`` the block's final gradient is also stored in ``gout``
# (the master's ``param.grad``): one more write stream.


@_jit
def gradient(g, n, start, p, slots, n_slots, weights, weighted, codes,
             args, gout, write_g):
    stop = start + n
    s = slots[0][start:stop]
    k = 1
    if weighted:
        w = weights[0]
        for j in range(n):
            g[j] = s[j] * w
        while k < n_slots:
            s = slots[k][start:stop]
            w = weights[k]
            for j in range(n):
                g[j] = g[j] + s[j] * w
            k += 1
    else:
        if n_slots == 1:
            for j in range(n):
                g[j] = s[j]
        else:
            t = slots[1][start:stop]
            for j in range(n):
                g[j] = s[j] + t[j]
            k = 2
        # Two slots per pass over the block, in the same order.
        while k + 1 < n_slots:
            s = slots[k][start:stop]
            t = slots[k + 1][start:stop]
            for j in range(n):
                g[j] = (g[j] + s[j]) + t[j]
            k += 2
        if k < n_slots:
            s = slots[k][start:stop]
            for j in range(n):
                g[j] = g[j] + s[j]
        w = weights[0]
        if w != 1:
            for j in range(n):
                g[j] = g[j] * w
    pb = p[start:stop]
    for h in range(codes.shape[0]):
        code = codes[h]
        a = args[h, 0]
        b = args[h, 1]
        if code == 0:
            for j in range(n):
                g[j] = g[j] + pb[j] * a
        elif code == 1:
            for j in range(n):
                x = pb[j]
                if x > 0:
                    g[j] = g[j] + a
                elif x < 0:
                    g[j] = g[j] - a
                elif x != x:
                    g[j] = g[j] + x
        elif code == 2:
            for j in range(n):
                x = g[j]
                if x < a:
                    x = a
                if x > b:
                    x = b
                g[j] = x
        else:
            # The loss scale's division, as UpdateRule.update divides.
            for j in range(n):
                g[j] = g[j] / a
    if write_g:
        go = gout[start:stop]
        for j in range(n):
            go[j] = g[j]


@_jit
def sgd(p, slots, n_slots, weights, weighted, codes, args, gout, write_g,
        begin, end, lr):
    g = numpy.empty(NUMBA_BLOCK, numpy.float32)
    for start in range(begin, end, NUMBA_BLOCK):
        n = min(NUMBA_BLOCK, end - start)
        gradient(g, n, start, p, slots, n_slots, weights, weighted, codes,
                 args, gout, write_g)
        pb = p[start:start + n]
        for j in range(n):
            pb[j] = pb[j] - g[j] * lr


@_jit
def momentum_sgd(p, slots, n_slots, weights, weighted, codes, args, gout,
                 write_g, begin, end, v, lr, momentum):
    g = numpy.empty(NUMBA_BLOCK, numpy.float32)
    for start in range(begin, end, NUMBA_BLOCK):
        n = min(NUMBA_BLOCK, end - start)
        gradient(g, n, start, p, slots, n_slots, weights, weighted, codes,
                 args, gout, write_g)
        pb = p[start:start + n]
        vb = v[start:start + n]
        for j in range(n):
            vj = vb[j] * momentum - g[j] * lr
            vb[j] = vj
            pb[j] = pb[j] + vj


@_jit
def corrected_momentum_sgd(p, slots, n_slots, weights, weighted, codes, args,
                           gout, write_g, begin, end, v, lr, momentum):
    g = numpy.empty(NUMBA_BLOCK, numpy.float32)
    for start in range(begin, end, NUMBA_BLOCK):
        n = min(NUMBA_BLOCK, end - start)
        gradient(g, n, start, p, slots, n_slots, weights, weighted, codes,
                 args, gout, write_g)
        pb = p[start:start + n]
        vb = v[start:start + n]
        for j in range(n):
            vj = vb[j] * momentum - g[j]
            vb[j] = vj
            pb[j] = pb[j] + vj * lr


@_jit
def nesterov(p, slots, n_slots, weights, weighted, codes, args, gout,
             write_g, begin, end, v, lr, momentum, k_v, k_g):
    g = numpy.empty(NUMBA_BLOCK, numpy.float32)
    for start in range(begin, end, NUMBA_BLOCK):
        n = min(NUMBA_BLOCK, end - start)
        gradient(g, n, start, p, slots, n_slots, weights, weighted, codes,
                 args, gout, write_g)
        pb = p[start:start + n]
        vb = v[start:start + n]
        for j in range(n):
            vj = vb[j] * momentum - g[j] * lr
            vb[j] = vj
            pb[j] = (pb[j] + vj * k_v) - g[j] * k_g


@_jit
def adam_block(g, r, n, pb, mb, vb, hb, c1, c2, alpha_t, eps,
                   amsgrad, adabound, lower, upper, decay, a, b):
    # Branch-free passes over the block (the flags are tested outside
    # the loops), so that each loop vectorizes; r holds the step.
    for j in range(n):
        gj = g[j]
        mj = mb[j]
        mb[j] = mj + (gj - mj) * c1
        vj = vb[j]
        vb[j] = vj + (gj * gj - vj) * c2
    if amsgrad:
        for j in range(n):
            hj = hb[j]
            vj = vb[j]
            # numpy.maximum: a NaN on either side wins.
            hj = hj if hj >= vj or hj != hj else vj
            hb[j] = hj
            r[j] = alpha_t / (numpy.sqrt(hj) + eps)
    else:
        for j in range(n):
            r[j] = alpha_t / (numpy.sqrt(vb[j]) + eps)
    if adabound:
        for j in range(n):
            x = r[j]
            x = lower if x < lower else x
            r[j] = upper if x > upper else x
    if decay:
        for j in range(n):
            pb[j] = pb[j] * a + (r[j] * mb[j]) * b
    else:
        for j in range(n):
            pb[j] = pb[j] + (r[j] * mb[j]) * b


@_jit
def adam(p, slots, n_slots, weights, weighted, codes, args, gout, write_g,
         begin, end, m, v, vhat, c1, c2, alpha_t, eps, amsgrad, adabound,
         lower, upper, decay, a, b):
    g = numpy.empty(NUMBA_BLOCK, numpy.float32)
    r = numpy.empty(NUMBA_BLOCK, numpy.float32)
    for start in range(begin, end, NUMBA_BLOCK):
        n = min(NUMBA_BLOCK, end - start)
        gradient(g, n, start, p, slots, n_slots, weights, weighted, codes,
                 args, gout, write_g)
        stop = start + n
        adam_block(g, r, n, p[start:stop], m[start:stop],
                       v[start:stop], vhat[start:stop], c1, c2, alpha_t,
                       eps, amsgrad, adabound, lower, upper, decay, a, b)


@_jit
def rmsprop(p, slots, n_slots, weights, weighted, codes, args, gout, write_g,
            begin, end, ms, lr, alpha, one_minus_alpha, eps, eps_inside_sqrt):
    g = numpy.empty(NUMBA_BLOCK, numpy.float32)
    for start in range(begin, end, NUMBA_BLOCK):
        n = min(NUMBA_BLOCK, end - start)
        gradient(g, n, start, p, slots, n_slots, weights, weighted, codes,
                 args, gout, write_g)
        pb = p[start:start + n]
        mb = ms[start:start + n]
        for j in range(n):
            gj = g[j]
            mb[j] = mb[j] * alpha + (gj * one_minus_alpha) * gj
        # The flag is tested outside the loops, so that each vectorizes.
        if eps_inside_sqrt:
            for j in range(n):
                pb[j] = pb[j] - (g[j] * lr) / numpy.sqrt(mb[j] + eps)
        else:
            for j in range(n):
                pb[j] = pb[j] - (g[j] * lr) / (numpy.sqrt(mb[j]) + eps)


@_jit
def adagrad(p, slots, n_slots, weights, weighted, codes, args, gout, write_g,
            begin, end, h, lr, eps):
    g = numpy.empty(NUMBA_BLOCK, numpy.float32)
    for start in range(begin, end, NUMBA_BLOCK):
        n = min(NUMBA_BLOCK, end - start)
        gradient(g, n, start, p, slots, n_slots, weights, weighted, codes,
                 args, gout, write_g)
        pb = p[start:start + n]
        hb = h[start:start + n]
        for j in range(n):
            gj = g[j]
            hj = hb[j] + gj * gj
            hb[j] = hj
            pb[j] = pb[j] - (gj * lr) / (numpy.sqrt(hj) + eps)


@_jit
def adadelta(p, slots, n_slots, weights, weighted, codes, args, gout,
             write_g, begin, end, msg, msdx, rho, one_minus_rho, eps):
    g = numpy.empty(NUMBA_BLOCK, numpy.float32)
    for start in range(begin, end, NUMBA_BLOCK):
        n = min(NUMBA_BLOCK, end - start)
        gradient(g, n, start, p, slots, n_slots, weights, weighted, codes,
                 args, gout, write_g)
        pb = p[start:start + n]
        gb = msg[start:start + n]
        xb = msdx[start:start + n]
        for j in range(n):
            gj = g[j]
            mj = gb[j] * rho + (gj * one_minus_rho) * gj
            gb[j] = mj
            dx = numpy.sqrt((xb[j] + eps) / (mj + eps)) * gj
            xb[j] = xb[j] * rho + (dx * one_minus_rho) * dx
            pb[j] = pb[j] - dx


@_jit
def rmsprop_graves(p, slots, n_slots, weights, weighted, codes, args, gout,
                   write_g, begin, end, ms, mg, delta, lr, alpha,
                   one_minus_alpha, momentum, eps):
    g = numpy.empty(NUMBA_BLOCK, numpy.float32)
    for start in range(begin, end, NUMBA_BLOCK):
        n = min(NUMBA_BLOCK, end - start)
        gradient(g, n, start, p, slots, n_slots, weights, weighted, codes,
                 args, gout, write_g)
        pb = p[start:start + n]
        nb = ms[start:start + n]
        mb = mg[start:start + n]
        db = delta[start:start + n]
        for j in range(n):
            gj = g[j]
            nj = nb[j] * alpha + (gj * one_minus_alpha) * gj
            nb[j] = nj
            mj = mb[j] * alpha + gj * one_minus_alpha
            mb[j] = mj
            dj = db[j] * momentum - (gj * lr) / numpy.sqrt(
                (nj - mj * mj) + eps)
            db[j] = dj
            pb[j] = pb[j] + dj


KERNELS = {'sgd': sgd, 'momentum_sgd': momentum_sgd,
           'corrected_momentum_sgd': corrected_momentum_sgd,
           'nesterov': nesterov, 'adam': adam, 'rmsprop': rmsprop,
           'adagrad': adagrad, 'adadelta': adadelta,
           'rmsprop_graves': rmsprop_graves}
