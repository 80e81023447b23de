"""Built-in probe texts for ``ssacli diagnose``.

These texts were written for the ssacli project as original prose (no copyrighted source); they are
used by ``ssacli diagnose`` when no ``--text`` file is given.
"""

from __future__ import annotations

import random

__all__ = ["NUMERIC_TEMPLATES", "TEXTS", "numeric_number"]

TEXTS: tuple[str, ...] = (
    (
        "Tardigrades are microscopic animals, usually less than a millimetre long, that live in moss, soil, "
        "and the sediments of lakes and oceans. When their surroundings dry out, they pull in their legs, "
        "lose almost all of their internal water, and enter a state called cryptobiosis in which metabolism "
        "nearly stops. In this form they can survive extreme cold, intense radiation, and even brief "
        "exposure to the vacuum of space. Once water returns, most individuals rehydrate within hours and "
        "resume feeding on plant cells, algae, and smaller invertebrates."
    ),
    (
        "To make a simple lentil soup, rinse two cups of brown lentils and set them aside. Warm a spoonful "
        "of olive oil in a heavy pot, then add one chopped onion, two diced carrots, and a stalk of celery. "
        "Cook gently for about eight minutes, stirring now and then, until the onion turns soft and golden. "
        "Add three crushed garlic cloves, a teaspoon of cumin, the lentils, and six cups of stock. Simmer "
        "for thirty minutes, season with salt and lemon juice, and serve with crusty bread."
    ),
    (
        "Every evening at six, the lighthouse keeper climbed the spiral stairs and spoke to the lamp as if "
        "it were an old friend. He told it about the gulls, the price of flour, and the letter his sister "
        "never answered. One stormy night the lamp flickered and went dark, and for a long moment he stood "
        "in the blackness, listening to the sea hammer the rocks. Then, without thinking, he began to sing. "
        "When the light sputtered back to life, he swore it had been waiting for the chorus."
    ),
    (
        "The city council voted seven to two on Tuesday night to approve a new bicycle lane along the "
        "length of Harbor Avenue, ending months of heated debate. Supporters argued that the lane would "
        "reduce traffic injuries and encourage residents to leave their cars at home. Several shop owners "
        "objected, saying the loss of parking spaces would drive customers away. Construction is expected "
        "to begin in early spring and last roughly ten weeks. The mayor said the project would be reviewed "
        "after one year of operation."
    ),
    (
        "Before replacing the hard drive in your laptop, back up every file you want to keep and unplug the "
        "charger. Turn the machine over on a soft cloth and remove the screws holding the bottom panel, "
        "keeping them in a small dish so none roll away. Touch a bare metal surface to discharge static "
        "electricity. Disconnect the battery cable first, then slide the old drive out of its bracket. Fit "
        "the new drive, reconnect the battery, close the panel, and install the operating system from a "
        "prepared USB stick."
    ),
    (
        '"Did you lock the back door?" Mara asked, pulling on her coat. "I think so," said Theo, who was '
        'already halfway down the driveway. "You think so, or you know so?" He stopped, sighed, and walked '
        'back toward the house. "Fine, I will check." A minute later he returned, holding up a key. "It was '
        'locked. It is always locked. You ask me this every single morning." Mara smiled. "And every single '
        'morning you are not quite sure, which is exactly why I keep asking."'
    ),
    (
        "By creating an account, the user agrees to provide accurate information and to keep their login "
        "credentials confidential. The service provider may suspend or terminate any account that is used "
        "to distribute unlawful content, interfere with the operation of the platform, or access data "
        "belonging to other users without permission. Fees paid for a subscription period are not "
        "refundable except where required by applicable law. These terms may be revised from time to time, "
        "and continued use of the service after notice of a revision constitutes acceptance of the revised "
        "terms."
    ),
    (
        "The river does not remember the rain that made it, yet it carries every drop toward the sea with "
        "the same patient care. At dawn it wears a scarf of mist; at noon it throws back pieces of the sky. "
        "Herons stand in its shallows like questions nobody has asked aloud. I have watched it for years "
        "and still cannot say where it begins to be a river and stops being a thousand small streams, each "
        "one sure it was going somewhere alone."
    ),
    (
        "I bought this electric kettle three months ago and have used it at least twice a day since. It "
        "boils a full litre of water in just under four minutes, which is faster than my old stovetop "
        "kettle, and the automatic shut-off has worked every time. The handle stays cool, and the water "
        "window is easy to read. My only complaint is the lid, which opens with a loud snap that wakes the "
        "whole house early in the morning. Overall, four stars and good value for the price."
    ),
    (
        "In the late medieval period, merchants travelling between inland market towns often joined "
        "together in caravans for protection against bandits and bad weather. A single wagon could carry "
        "wool, salt, iron tools, and barrels of wine, and a successful journey might double a trader's "
        "wealth in a season. Towns along the route competed for this business by building inns, repairing "
        "bridges, and offering lower tolls. Over several generations, some of these modest stopping places "
        "grew into busy commercial centres with their own guilds and courts."
    ),
    (
        "This function walks the dependency graph in topological order and returns the list of modules that "
        "must be rebuilt. It first collects every node whose source file has changed since the last build, "
        "then marks all of their descendants as dirty. Cycles are not expected here because the loader "
        "rejects them earlier, but if one appears we raise an error instead of looping forever. The result "
        "is sorted so that repeated calls with the same input always produce the same order, which keeps "
        "the build logs easy to compare."
    ),
    (
        "And here comes the final lap, with the leader still holding a narrow gap of half a second over the "
        "young challenger from the north. The crowd is on its feet now, waving flags and shouting with "
        "every stride. Into the last bend they go, shoulder to shoulder, neither willing to give an inch. "
        "The challenger swings wide, finds a burst of speed from somewhere, and draws level on the home "
        "straight. It is going to be a photo finish, and nobody in this stadium can breathe."
    ),
    (
        "A delta forms where a river meets a slower body of water, such as a lake or a sea, and drops the "
        "sand and silt it has carried from upstream. Because the current loses speed so suddenly, the "
        "sediment piles up in layers, and the river splits into many smaller channels that spread out like "
        "the fingers of a hand. Deltas are often extremely fertile and have supported farming communities "
        "for thousands of years, but they are also low and flat, which makes them vulnerable to flooding "
        "and rising sea levels."
    ),
    (
        "Dear Aunt Rosa, thank you so much for the knitted scarf you sent for my birthday. It arrived on "
        "the coldest day of the month, so I wore it straight away, and three people at work asked where I "
        "had bought it. I told them proudly that it was handmade by the best knitter in the family. The new "
        "apartment is small but bright, and the neighbours are friendly. I hope your garden survived the "
        "frost. Please write soon and tell me how the apple trees are doing."
    ),
    (
        "In the event of a fire alarm, stop what you are doing and leave the building by the nearest marked "
        "exit. Do not use the elevators, and do not go back for personal belongings. Walk quickly but "
        "calmly, keeping to the right side of the stairwell so that emergency staff can move upward. Once "
        "outside, gather at the assembly point in the north parking area and report to your floor warden. "
        "Stay there until a staff member tells you that it is safe to return."
    ),
    (
        "Photosynthesis takes place mainly in the leaves of green plants, inside small structures called "
        "chloroplasts. These contain a pigment that absorbs red and blue light while reflecting green, "
        "which is why most foliage looks green to our eyes. The captured energy is used to split water "
        "molecules, releasing oxygen as a by-product, and to build sugars from carbon dioxide taken from "
        "the air. The plant then uses those sugars for growth, stores them as starch, or sends them to its "
        "roots and fruits."
    ),
    (
        "Once there was a baker who could not sleep unless the whole village had bread for the morning. "
        "Each night she counted the houses, counted the loaves, and counted again, just to be sure. One "
        "winter a stranger arrived with nothing but a fiddle and a hungry dog. The baker found she had one "
        "loaf too few, so she gave away her own. In the morning she woke to music under her window, and for "
        "the first time in years she did not count anything at all."
    ),
    (
        "The planning committee met on Thursday afternoon with six members present and one absent. The "
        "chair opened by reviewing the action items from the previous session, noting that the budget "
        "summary had been circulated but the venue contract was still unsigned. After a short discussion, "
        "members agreed to extend the deadline for speaker proposals by two weeks. The treasurer reported "
        "that expenses remain within the approved limit. The meeting closed at half past four, and the next "
        "session will be scheduled by email."
    ),
    (
        "The train leaves the coast just after sunrise and climbs slowly through terraced hills planted "
        "with olives and grapevines. Small stone villages appear and vanish around each curve, their church "
        "towers catching the early light. By mid-morning the air through the open window smells of pine, "
        "and the track clings to the side of a narrow gorge where a green river tumbles far below. "
        "Passengers who were reading put their books aside, and for a while nobody in the carriage says a "
        "word."
    ),
    (
        "A comet is a small body of ice, dust, and rock that travels around the sun on a long, stretched "
        "orbit. Far from the sun it is cold, dark, and almost impossible to see. As it moves closer, the "
        "heat turns some of its ice directly into gas, which escapes along with dust to form a glowing "
        "cloud called the coma. Sunlight and the solar wind push this material away, creating one or more "
        "tails that always point away from the sun, no matter which direction the comet is moving."
    ),
    (
        "Hello, and thank you for contacting our support team. I am sorry to hear that your order arrived "
        "with a cracked screen. I have arranged for a replacement to be shipped to the same address at no "
        "extra cost, and you should receive a tracking number within one business day. There is no need to "
        "send the damaged item back unless our courier asks for it. If anything else goes wrong, simply "
        "reply to this message and it will come straight to me. Have a pleasant week."
    ),
    (
        "We often speak of habits as if they were chains, but a habit is also a kind of gift from our past "
        "selves. Someone who learned long ago to tie their shoes without thinking is free to think about "
        "something else. The trouble begins only when a habit outlives the reason it was formed, and we "
        "keep repeating an action whose purpose nobody remembers. Perhaps wisdom is not the absence of "
        "habits but the willingness to examine them now and then, keeping the useful ones and gently "
        "setting the others down."
    ),
    (
        "Tomatoes grow best in a sunny spot that receives at least six hours of direct light each day. "
        "Plant seedlings deeply, burying part of the stem, because new roots will form along the buried "
        "section and make the plant sturdier. Water at the base rather than over the leaves, which helps "
        "prevent fungal disease, and try to keep the soil evenly moist. Once the plants begin to flower, "
        "add a stake or cage for support. Pinch off side shoots if you want fewer but larger fruits."
    ),
    (
        "The inspector studied the muddy footprints leading from the greenhouse to the garden gate. They "
        "were deep at the heel and shallow at the toe, as though whoever made them had been walking "
        "backward. He crouched, measured one with his notebook, and frowned. The gardener insisted he had "
        "heard nothing all night, yet his boots, drying by the stove, were exactly the same size. Outside, "
        "the rain began again, and the inspector knew that by morning the only clue would be gone."
    ),
)

NUMERIC_TEMPLATES: tuple[str, ...] = (
    ("The warehouse shipped {n} boxes on Monday, and by Friday the ledger still showed exactly {n} boxes."),
    (
        "Her savings account held {n} dollars at the start of the year and, after careful budgeting, still "
        "held {n} dollars at the end."
    ),
    ("Order number {n} was delayed at the depot, so the customer called to ask about order number {n}."),
    (
        "The trail sign said the summit was {n} meters away; after an hour of climbing, another sign still "
        "said {n} meters."
    ),
    (
        "Please enter the verification code {n} on the next screen. If it does not work, type {n} again "
        "carefully."
    ),
    (
        "The library owns {n} books in total. Last month the inventory team counted every shelf and "
        "confirmed {n} books."
    ),
    (
        "The invoice lists a balance of {n} euros. To settle your account, transfer {n} euros to the "
        "reference shown below."
    ),
    (
        "Room {n} is on the third floor. Guests looking for room {n} should take the east elevator, and "
        "room {n} is the last door."
    ),
    ("The farm harvested {n} apples this season, compared with {n} apples in the previous season."),
    ("Patient file {n} was updated this morning; the nurse checked the bracelet, which also read {n}."),
    (
        "The stadium sold {n} tickets for the final. Officials later announced that {n} tickets had been "
        "scanned at the gates."
    ),
    ("The recipe makes {n} cookies, so if you double nothing and change nothing, you will get {n} cookies."),
    (
        "Tracking ID {n} shows the parcel left the sorting center. Search for {n} on the website to follow "
        "it, or quote {n} when you call."
    ),
    (
        "The spacecraft had traveled {n} kilometers when the engines shut down, and the display froze at "
        "{n} kilometers."
    ),
    (
        "Our team wrote {n} lines of code this sprint. The review tool agreed: {n} lines were added to the "
        "main branch."
    ),
    ("The jar contains {n} marbles. Maya guessed {n} marbles, and she won the prize for the exact count."),
)


def numeric_number(digits: int, rng: random.Random) -> str:
    """Return a random positive integer with exactly ``digits`` digits (no leading zero) as a string."""
    if digits < 1:
        raise ValueError(f"digits must be >= 1, got {digits}")
    return str(rng.randint(10 ** (digits - 1), 10**digits - 1))


def special_prefix(tokenizer) -> list[int]:
    """The ids the tokenizer puts before any text by default (Gemma's and Llama's ``<bos>``; none for
    GPT-2-style tokenizers): every window cut from a tokenized stream starts with them, as the model
    saw its inputs in training. Without it Gemma 3 270M's loss on the built-in texts was 5.9-7.1
    nats per token instead of 2.5-3.4 (docs/diagnose.md, worked example), so the probes measured a
    model shifted by its own missing ``<bos>``."""
    if tokenizer is None:
        return []
    marked = tokenizer("a")["input_ids"]
    plain = tokenizer("a", add_special_tokens=False)["input_ids"]
    for start in range(len(marked) - len(plain) + 1):
        if plain and marked[start : start + len(plain)] == plain:
            return list(marked[:start])
    return []
