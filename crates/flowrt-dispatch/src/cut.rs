//! Cutting a plan into runlists of at most N decoder layers.

use std::ops::Range;
use std::time::Duration;

use flowrt_model::Plan;

/// A contiguous run of a plan's groups, submitted and watched as one unit.
#[derive(Clone, Debug, PartialEq)]
pub struct Runlist {
    /// Position in the step (0-based) and how many runlists the step has.
    pub index: usize,
    pub count: usize,
    /// Indices of the plan's groups.
    pub groups: Range<usize>,
    /// First and last decoder layer covered (`None` for a plan without layers).
    pub layers: Option<(usize, usize)>,
    /// How long the device gets.
    pub deadline: Duration,
}

impl Runlist {
    /// `layers a–b` for messages.
    pub fn describe_layers(&self) -> String {
        match self.layers {
            Some((a, b)) if a == b => format!("layer {a}"),
            Some((a, b)) => format!("layers {a}–{b}"),
            None => "no layers".into(),
        }
    }
}

/// Where each layer's groups start in a plan, computed once per plan.
#[derive(Clone, Debug)]
pub struct LayerIndex {
    /// `starts[l]`: index of the first group of layer `l`.
    starts: Vec<usize>,
    n_groups: usize,
}

impl LayerIndex {
    pub fn new(plan: &Plan) -> LayerIndex {
        let mut starts: Vec<usize> = Vec::new();
        for (i, g) in plan.groups.iter().enumerate() {
            if let Some(l) = g.kind.layer() {
                if l == starts.len() {
                    starts.push(i);
                }
            }
        }
        LayerIndex {
            starts,
            n_groups: plan.groups.len(),
        }
    }

    pub fn n_layers(&self) -> usize {
        self.starts.len()
    }

    /// How many runlists a step has with at most `depth` layers each (`None`: one).
    pub fn count(&self, depth: Option<usize>) -> usize {
        match depth {
            Some(d) if self.n_layers() > 0 => self.n_layers().div_ceil(d.max(1)),
            _ => 1,
        }
    }

    /// Runlist `k` of `count(depth)`: layers `k·d ..` plus, for the first, the groups before
    /// layer 0 (embedding) and, for the last, the groups after the last layer (output).
    pub fn runlist(&self, depth: Option<usize>, k: usize) -> Runlist {
        let count = self.count(depth);
        let l = self.n_layers();
        if count == 1 || l == 0 {
            return Runlist {
                index: 0,
                count: 1,
                groups: 0..self.n_groups,
                layers: (l > 0).then(|| (0, l - 1)),
                deadline: Duration::ZERO,
            };
        }
        let d = depth.unwrap_or(l).max(1);
        let (a, b) = (k * d, ((k + 1) * d).min(l) - 1);
        let start = if k == 0 { 0 } else { self.starts[a] };
        let end = if k + 1 == count {
            self.n_groups
        } else {
            self.starts[b + 1]
        };
        Runlist {
            index: k,
            count,
            groups: start..end,
            layers: Some((a, b)),
            deadline: Duration::ZERO,
        }
    }
}

/// All runlists of a step with at most `depth` layers each (`None`: one runlist).
pub fn runlists(plan: &Plan, depth: Option<usize>) -> Vec<Runlist> {
    let idx = LayerIndex::new(plan);
    (0..idx.count(depth))
        .map(|k| idx.runlist(depth, k))
        .collect()
}
